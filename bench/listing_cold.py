#!/usr/bin/env python3
"""Listing a tree another mount made: morris builds side by side with local disk.

For each of --runs rounds, in order: a local directory under --base-dir, then
for each --exe a fresh 4-server loopback volume (bench/lib/loopback.py). On
each, `tar xf` of small_writes.py's deterministic tree (14,015 entries: 715
directories, 13,300 files) through one mount, untimed; then, each through a
mount made for it (nothing cached there yet; page caches dropped first):

  find       `find TREE -name '*.dat'`: names only, no stat (what a
             `READDIRPLUS` costs a program that does not look)      -> s
  lsR        `ls -lR TREE`: a stat and two getxattrs per entry      -> s
  lsR2       the same again on that mount, at once                  -> s

On the local disk the same commands run on the untarred tree after dropping
the page cache. Prints medians per system and the ratio to local disk;
writes JSON with every figure (--out). Needs root (FUSE, drop_caches), tar.
Usage:
  sudo python3 bench/listing_cold.py --exe target/release/morris [--exe OTHER ...]
           [--runs 3] [--base-dir /var/tmp] [--out FILE]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from lib.loopback import BenchError, Volume, require_root_fuse  # noqa: E402
from lib.util import drop_caches  # noqa: E402
from small_writes import make_tree_tar  # noqa: E402

TESTS = ["find", "lsR", "lsR2"]
FILES = 13_300


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def run(cmd, timeout):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed: {out.stdout}{out.stderr}")
    return out.stdout


def timed(cmd, timeout, files):
    """Seconds `cmd` took; its output must name every file of the tree."""
    t = time.perf_counter()
    out = run(cmd, timeout)
    took = time.perf_counter() - t
    if out.count(".dat") != files:
        raise BenchError(f"{' '.join(cmd)} named {out.count('.dat')} files, want {files}")
    return round(took, 3)


def listings(tree_on, timeout):
    """`tree_on(test)`: the tree's path as the test's own view sees it."""
    r = {}
    r["find"] = timed(["find", tree_on("find"), "-name", "*.dat"], timeout, FILES)
    tree = tree_on("lsR")
    r["lsR"] = timed(["ls", "-lR", tree], timeout, FILES)
    r["lsR2"] = timed(["ls", "-lR", tree], timeout, FILES)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", action="append", help="morris binary (repeat to compare builds)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one step may take")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-listing-cold.json"))
    a = ap.parse_args()
    exes = [os.path.abspath(e) for e in (a.exe or ["target/release/morris"])]
    names = [os.path.basename(e) for e in exes]
    if len(set(names)) != len(names):
        ap.error("give each --exe a different file name")
    for e in exes:
        require_root_fuse("listing_cold.py", e)
    base = tempfile.mkdtemp(prefix="morris-lc-", dir=a.base_dir)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
              "exes": exes, "runs": []}
    failure = None
    try:
        tarball = os.path.join(base, "tree.tar")
        make_tree_tar(tarball)
        for r in range(a.runs):
            for name, exe in [("local", None)] + list(zip(names, exes)):
                log(f"run {r + 1}/{a.runs}: {name}")
                if exe is None:
                    where = os.path.join(base, f"local{r}")
                    os.mkdir(where)
                    run(["tar", "xf", tarball, "-C", where], a.timeout)
                    drop_caches()
                    res = listings(lambda _t: os.path.join(where, "tree"), a.timeout)
                    shutil.rmtree(where)
                else:
                    vol = Volume(exe, os.path.join(base, f"vol{r}-{name}"), 4, 1)
                    try:
                        made = vol.mount(os.path.join(base, f"m{r}-{name}-made"))
                        run(["tar", "xf", tarball, "-C", made], a.timeout)
                        drop_caches()

                        def fresh(test, vol=vol, r=r, name=name):
                            m = vol.mount(os.path.join(base, f"m{r}-{name}-{test}"))
                            return os.path.join(m, "tree")

                        res = listings(fresh, a.timeout)
                    finally:
                        vol.stop()
                    shutil.rmtree(os.path.join(base, f"vol{r}-{name}"), ignore_errors=True)
                log(f"  {res}")
                result["runs"].append({"run": r, "system": name, **res})
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        failure = str(e)
    except KeyboardInterrupt:
        failure = "interrupted"
    systems = ["local"] + names
    summary = {}
    for n in systems:
        rows = [x for x in result["runs"] if x["system"] == n]
        summary[n] = {t: statistics.median([x[t] for x in rows]) for t in TESTS if rows}
    result["median"] = summary
    print(f"\n{'test':6} {'unit':5}" + "".join(f" {n[:22]:>22}" for n in systems)
          + "".join(f" {n[:14] + '/local':>20}" for n in systems[1:]))
    for t in TESTS:
        if not all(t in summary[n] for n in systems):
            continue
        row = f"{t:6} {'s':5}" + "".join(f" {summary[n][t]:22.3f}" for n in systems)
        for n in systems[1:]:
            row += f" {summary[n][t] / summary['local'][t]:20.2f}"
        print(row)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {a.out}")
    if failure:
        print(f"\nFAILED: {failure} (logs under {base})", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
