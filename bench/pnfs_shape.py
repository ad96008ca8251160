#!/usr/bin/env python3
"""The pNFS study's benchmarks (its Figs. 8-12): morris beside MooseFS and the local disk, one run (issue 18).

pnfs-for-everyone.txt, section 6, measures one client with FIO (sequential and random
reads and writes over a range of request sizes, Figs. 9-12) and with Filebench's
fileserver, varmail, webserver and videoserver personalities (Fig. 8, Table 2). The same
shapes here, on hosts of their own (bench/cluster network namespaces on one bridge, every
link --rate, 4 Gbit/s by default: round trips and CPU are measured, not the links): h0 the
client (one `morris mount`, one `mfsmount`), 4 morris servers (one copy) on h1..h4,
MooseFS 3.0 (master on h4, chunkservers on h1..h3, goal 1), and a directory on this
machine's disk. Each run goes through every system in turn (page caches dropped before
each system's turn), one benchmark at a time:

  (a) fio sweep   rw = write, randwrite, read, randread x bs = --sizes (4k .. 1m); one job,
                  O_DIRECT, psync, a --file-mib file laid out once per system and run,
                  --secs seconds each (writes end with an fsync, inside the time)   -> MiB/s
  (b) personalities, fio job files written from Filebench's definitions (Filebench is not in
      Debian 12 and cannot be downloaded here), scaled to this 2-CPU machine, buffered I/O as
      Filebench uses, --secs-personality seconds each:
        fileserver   8 jobs, 1,600 files of 128 KiB in directories of 20 names (Filebench:
                     10,000 files, 50 threads), whole-file reads and writes at random, 1:2
        varmail      4 jobs, 1,000 files of 16 KiB in one directory, 16 KiB reads and
                     writes at random 1:1, fsync after every write (Filebench: 16 threads)
        webserver    8 jobs, 1,000 files of 16 KiB, whole-file reads at random, plus one
                     job writing 16 KiB at a time to a log (Filebench: 100 threads, 10:1)
        videoserver  4 jobs, a file of 256 MiB each, sequential 256 KiB reads (Filebench:
                     48 readers of 1 GiB videos and a writer of new ones; the paper's
                     "read only")
      as Filebench's flows do, each I/O of the first three opens its file, does it and closes
      it (fio `openfiles=1`, a random file each time), and nothing drops the page cache
      while they run (`invalidate=0`: fio's default drops a file's cached pages each time
      it starts on it, which makes every read of a small file an uncached one);
      where fio differs from Filebench: it neither creates nor deletes files while it runs
      (Filebench's fileserver and varmail do, and stat them), its writes overwrite whole
      files instead of appending, and it lays every file out before the clock starts
                                                                          -> MiB/s, ops/s
  (c) dbench     Debian's dbench (client.txt load, --dbench-clients clients, --secs-dbench s),
                 a second, independent small-file load                        -> MB/s

Prints medians, the ratios morris/MooseFS and morris/local, writes JSON (--out) with every
figure and a PNG (--png). Needs root, iproute2, fuse3, fio, dbench, moosefs-master,
moosefs-chunkserver, moosefs-client, python3-matplotlib (for the plot).

Usage: python3 bench/pnfs_shape.py [--exe target/release/morris] [--runs 3] [--parts abc]
       python3 bench/pnfs_shape.py --replot bench/results-pnfs-shape.json --png docs/pnfs-shape.png
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
from cluster.hosts import Cluster, drop_caches, require_root_and_tools  # noqa: E402
from cluster import systems  # noqa: E402

SYSTEMS = ("local", "morris", "moosefs")
RWS = ("write", "randwrite", "read", "randread")

# Filebench personalities as fio job files (see the docstring for how they differ).
GLOBAL = """
[global]
directory={dir}
ioengine=psync
runtime={secs}
time_based=1
group_reporting=1
invalidate=0
"""
PERSONALITIES = {
    "fileserver": GLOBAL + """file_service_type=random
openfiles=1
[fileserver]
numjobs=8
nrfiles=200
filesize=128k
bs=128k
rw=randrw
rwmixread=33
""",
    "varmail": GLOBAL + """file_service_type=random
openfiles=1
[varmail]
numjobs=4
nrfiles=250
filesize=16k
bs=16k
rw=randrw
rwmixread=50
fsync=1
""",
    "webserver": GLOBAL + """[webserver]
numjobs=8
nrfiles=125
filesize=16k
bs=16k
rw=randread
file_service_type=random
openfiles=1
[weblog]
numjobs=1
filename=weblog
size=64m
bs=16k
rw=write
rate_iops=200
""",
    "videoserver": GLOBAL + """[videoserver]
numjobs=4
nrfiles=1
filesize=256m
bs=256k
rw=read
""",
}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def fio_json(argv, timeout):
    """Runs fio with JSON output; returns (MiB/s read+write, ops/s read+write) summed over its jobs."""
    p = subprocess.run(["fio", "--output-format=json", *argv], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"fio {' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    # fio may print warnings before the JSON document.
    doc = json.loads(p.stdout[p.stdout.index("{"):])
    bw = ops = 0.0
    for j in doc["jobs"]:
        for d in ("read", "write"):
            bw += j[d]["bw_bytes"] / 2**20
            ops += j[d]["iops"]
    return bw, ops


def sweep(d, a):
    """(a): one laid-out file, then each rw x bs for --secs seconds."""
    os.makedirs(d)
    f = os.path.join(d, "sweep")
    common = [f"--filename={f}", f"--size={a.file_mib}m", "--ioengine=psync", "--direct=1", "--numjobs=1"]
    # Lay the file out (untimed): a full sequential write.
    fio_json(["--name=layout", *common, "--rw=write", "--bs=1m", "--end_fsync=1"], timeout=600)
    out = {}
    for rw in RWS:
        for bs in a.sizes:
            extra = ["--end_fsync=1"] if "write" in rw else []
            bw, ops = fio_json([f"--name={rw}-{bs}", *common, f"--rw={rw}", f"--bs={bs}", "--time_based=1",
                                f"--runtime={a.secs}", *extra], timeout=a.secs * 10 + 120)
            out[f"{rw}/{bs}"] = bw
    os.unlink(f)
    return out


def personalities(d, a, names):
    """(b): each personality's job file in a directory of its own; layout is untimed (fio's)."""
    out = {}
    for name in names:
        pd = os.path.join(d, name)
        os.makedirs(pd)
        job = os.path.join(pd + ".fio")
        with open(job, "w") as f:
            f.write(PERSONALITIES[name].format(dir=pd, secs=a.secs_personality))
        bw, ops = fio_json([job], timeout=a.secs_personality * 10 + 600)
        out[name] = {"mib_s": bw, "ops_s": ops}
        os.unlink(job)
        shutil.rmtree(pd, ignore_errors=True)
    return out


def dbench(d, a):
    """(c): dbench's throughput line, MB/s."""
    os.makedirs(d)
    p = subprocess.run(["dbench", "-D", d, "-t", str(a.secs_dbench), str(a.dbench_clients)],
                       capture_output=True, text=True, timeout=a.secs_dbench * 10 + 300)
    for line in p.stdout.splitlines():
        if line.strip().startswith("Throughput"):
            mb = float(line.split()[1])
            if mb <= 0:
                raise RuntimeError(f"dbench measured nothing in {a.secs_dbench} s (its warm-up took the run): "
                                   "give --secs-dbench more")
            return mb
    raise RuntimeError(f"dbench printed no throughput (rc {p.returncode}): {p.stdout[-400:]} {p.stderr[-400:]}")


def med(xs):
    return statistics.median(xs) if xs else None


def summarize(runs, a):
    s = {}
    for sysname in SYSTEMS:
        rs = [r for r in runs if r["system"] == sysname]
        row = {}
        if "a" in a.parts:
            for rw in RWS:
                for bs in a.sizes:
                    row[f"{rw}/{bs}"] = med([r["sweep"][f"{rw}/{bs}"] for r in rs])
        if "b" in a.parts:
            for n in a.personalities:
                row[f"{n} MiB/s"] = med([r["personalities"][n]["mib_s"] for r in rs])
                row[f"{n} ops/s"] = med([r["personalities"][n]["ops_s"] for r in rs])
        if "c" in a.parts:
            row["dbench MB/s"] = med([r["dbench"] for r in rs])
        s[sysname] = row
    return s


def table(s):
    keys = list(s["local"])
    lines = [f"{'benchmark':26}{'local':>10}{'morris':>10}{'MooseFS':>10}{'morris/MooseFS':>16}{'morris/local':>14}"]
    for k in keys:
        lo, m, f = s["local"][k], s["morris"][k], s["moosefs"][k]
        lines.append(f"{k:26}{lo:10.1f}{m:10.1f}{f:10.1f}{m / f if f else float('nan'):16.2f}"
                     f"{m / lo if lo else float('nan'):14.2f}")
    return "\n".join(lines)


def plot(s, a, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no PNG")
        return
    colors = {"local": "#777777", "morris": "#1f77b4", "moosefs": "#d62728"}
    labels = {"local": "local disk", "morris": "morris (4 servers)", "moosefs": "MooseFS (3 chunkservers)"}
    panels = []
    if "a" in a.parts:
        panels += [("a", rw) for rw in RWS]
    if "b" in a.parts or "c" in a.parts:
        panels.append(("b", None))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.4))
    if len(panels) == 1:
        axes = [axes]
    for ax, (kind, rw) in zip(axes, panels):
        if kind == "a":
            xs = list(range(len(a.sizes)))
            for sysname in SYSTEMS:
                ax.plot(xs, [s[sysname][f"{rw}/{bs}"] for bs in a.sizes], marker="o", color=colors[sysname],
                        label=labels[sysname])
            ax.set_xticks(xs)
            ax.set_xticklabels(a.sizes)
            ax.set_yscale("log")
            ax.set_xlabel("request size")
            ax.set_ylabel("MiB/s")
            ax.set_title(f"fio {rw} (O_DIRECT)", fontsize=9)
        else:
            names = ([f"{n} MiB/s" for n in a.personalities] if "b" in a.parts else []) + \
                    (["dbench MB/s"] if "c" in a.parts else [])
            width = 0.27
            for i, sysname in enumerate(SYSTEMS):
                ax.bar([x + (i - 1) * width for x in range(len(names))], [s[sysname][n] for n in names], width,
                       color=colors[sysname], label=labels[sysname])
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels([n.split()[0] for n in names], rotation=30, fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel("MiB/s (dbench: MB/s)")
            ax.set_title("Filebench shapes (fio), dbench", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"pNFS study's benchmarks, one client, medians of {a.runs} ({time.strftime('%Y-%m-%d')})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log("wrote", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=os.environ.get("MORRIS_EXE", "target/release/morris"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parts", default="abc", help="a: fio sweep, b: personalities, c: dbench")
    ap.add_argument("--sizes", default="4k,32k,128k,1m", help="(a) request sizes")
    ap.add_argument("--file-mib", type=int, default=256, help="(a) the file's size")
    ap.add_argument("--secs", type=int, default=4, help="(a) seconds per rw and size")
    ap.add_argument("--personalities", default="fileserver,varmail,webserver,videoserver")
    ap.add_argument("--secs-personality", type=int, default=10)
    ap.add_argument("--secs-dbench", type=int, default=10)
    ap.add_argument("--dbench-clients", type=int, default=4)
    ap.add_argument("--rate", default="4gbit")
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--out", default="bench/results-pnfs-shape.json")
    ap.add_argument("--png", default="docs/pnfs-shape.png")
    ap.add_argument("--replot", metavar="JSON", help="draw --png from a results file of an earlier run, run nothing")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            res = json.load(f)
        for k in ("runs", "parts", "sizes", "personalities"):
            setattr(a, k, res["args"][k])
        plot(res["median"], a, a.png)
        return
    a.sizes = [x for x in a.sizes.split(",") if x]
    a.personalities = [x for x in a.personalities.split(",") if x]
    for n in a.personalities:
        if n not in PERSONALITIES:
            ap.error(f"unknown personality {n} (known: {', '.join(PERSONALITIES)})")
    require_root_and_tools(("mfsmaster", "mfschunkserver", "mfsmount", "fio", "dbench"))
    exe = os.path.abspath(a.exe)
    work = tempfile.mkdtemp(prefix="morris-pnfs-", dir=a.base_dir)
    local = os.path.join(work, "local")
    os.makedirs(local)
    runs = []
    t0 = time.time()
    try:
        with Cluster(5, a.rate, prefix="ps-", subnet="10.79.0") as cl:
            mo, mfs, mnt = systems.morris_beside_moosefs(cl, exe)
            mnt["local"] = local
            try:
                for run in range(a.runs):
                    # Rotate the order each run: whoever goes first finds the machine coolest.
                    order = SYSTEMS[run % 3:] + SYSTEMS[:run % 3]
                    for name in order:
                        drop_caches()
                        base = os.path.join(mnt[name], f"r{run}")
                        os.makedirs(base)
                        r = {"run": run, "system": name}
                        if "a" in a.parts:
                            r["sweep"] = sweep(os.path.join(base, "a"), a)
                        if "b" in a.parts:
                            drop_caches()
                            r["personalities"] = personalities(os.path.join(base, "b"), a, a.personalities)
                        if "c" in a.parts:
                            drop_caches()
                            r["dbench"] = dbench(os.path.join(base, "c"), a)
                        shutil.rmtree(base, ignore_errors=True)
                        log(f"run {run + 1}/{a.runs} {name}: "
                            + json.dumps({k: v for k, v in r.items() if k not in ("run", "system")},
                                         default=lambda x: round(x, 1)))
                        runs.append(r)
            finally:
                mo.stop()
                mfs.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = summarize(runs, a)
    print()
    print(f"pNFS study's benchmarks, one client; medians of {a.runs} runs; links {a.rate}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {time.time() - t0:.0f} s")
    print(table(s))
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "command": " ".join(sys.argv),
           "exe": exe, "args": {k: v for k, v in vars(a).items()}, "runs": runs, "median": s}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    log("wrote", a.out)
    if a.png:
        plot(s, a, a.png)


if __name__ == "__main__":
    main()
