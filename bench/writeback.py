#!/usr/bin/env python3
"""Cache mode II (issue 15, "Done when"): writing into a `sw` cache of an NFS home against writing a
plain morris directory, and the write-back's drain to home against writing home directly, on the
emulated cluster (bench/cluster).

    python3 bench/writeback.py [--runs 3] [--servers 4] [--size 512M] [--files 10000]
                               [--server-rate 200mbit] [--home-rate 800mbit] [--client-rate 800mbit]

Topology (network namespaces + tbf on veths, as bench/cache.py; prefix cw-, subnet 10.84.0):
  cw-h0  home: nfs-ganesha (bench/lib/ganesha.py, FSAL VFS, attribute cache off) exporting an
         empty local directory; link --home-rate.
  cw-h1  the client: the FUSE mount of the morris volume, nfs-cp for home direct; link
         --client-rate.
  cw-h2.. one morris stripe server each; link --server-rate.
  The volume has `plain/` (an ordinary directory) and `c/` bound to home (`--mode sw
  --sync-lag 15s`, made once). Each run makes its own directories (plain/rN, c/rN).

Per run, each configuration once, the order rotated each run:
  creates   --files empty files created (open O_CREAT + close) in a fresh directory, timed in
            the benchmark process: in plain/rN, and in c/rN (a sw cache: nothing of home is
            involved; the write-back runs after the sync lag, or at the flush below);
  write     one --size file written with 1 MiB write(2)s and fsync'd (bench/cluster
            write_file), in plain/rN and in c/rN;
  burst     right after the cached creates: `morris cache flush c` (in the client host), timed
            until it returns: every one of the --files files is at home (checked by listing
            home's directory afterwards);
  drain     right after the cached write: `morris cache flush c`, timed: the file's bytes go
            from the k servers to home (each server its stripe units, in parallel) --size / time;
  direct    the same --size file written from the client host to home with libnfs `nfs-cp`
            (a local file, page-cached, copied to nfs://home/export/direct-rN).
  Home's copies are checked (SHA-256 of the drained file equals the written one) after each run.
Goals (issue 15): cached creates/s and write MiB/s >= 0.9 x plain; drain >= 0.9 x direct.

Writes bench/results-writeback.json (date, exact command, commit, binary, raw per-run figures,
medians) and prints a table. Needs root, iproute2, fuse3, nfs-ganesha(-vfs), rpcbind,
libnfs-utils. Everything is removed on exit. Duration with the defaults: about 5 minutes.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

from cluster.hosts import Cluster, ShapingError, parse_rate, require_root_and_tools  # noqa: E402
from cluster.systems import MORRIS, MiB, Morris, write_file  # noqa: E402
from lib.ganesha import Ganesha  # noqa: E402
from lib.util import log_warnings, parse_size  # noqa: E402

NFS_PORT = 2049


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def git(*args):
    return subprocess.run(["git", *args], cwd=os.path.dirname(BENCH), capture_output=True,
                          text=True).stdout.strip()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(4 * MiB), b""):
            h.update(b)
    return h.hexdigest()


def creates(d, n):
    """Creates n empty files in the new directory d; returns creates per second."""
    os.mkdir(d)
    t = time.perf_counter()
    for i in range(n):
        os.close(os.open(os.path.join(d, f"f{i:06d}"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    return n / (time.perf_counter() - t)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


class Bench:
    def __init__(self, cl, a):
        self.cl, self.a = cl, a
        self.home, self.client, self.servers = cl.hosts[0], cl.hosts[1], cl.hosts[2:]
        self.export = os.path.join(self.home.dir, "export")
        self.ganesha = None
        self.vol = None
        self.mnt = None

    def setup(self):
        os.makedirs(self.export)
        self.ganesha = Ganesha(self.export, os.path.join(self.home.dir, "ganesha"), netns=self.home.ns,
                               bind_addr=self.home.addr, port=NFS_PORT, attr_expiration=0)
        self.ganesha.start()
        self.vol = Morris(self.cl, self.servers)
        self.mnt = self.vol.mount(self.client, name="m")
        os.mkdir(os.path.join(self.mnt, "plain"))
        os.mkdir(os.path.join(self.mnt, "c"))
        out = self.morris("cache", "bind", os.path.join(self.mnt, "c"), self.url(), "--mode", "sw",
                          "--sync-lag", "15s")
        log(out.strip())
        self.source = os.path.join(self.client.dir, "source")
        write_file(self.source, self.a.size, seed=7)
        self.source_sum = sha256(self.source)

    def url(self, sub=""):
        path = "/export" + ("/" + sub if sub else "")
        return f"nfs://{self.home.addr}{path}?version=3&nfsport={NFS_PORT}&mountport={self.ganesha.mount_port}"

    def morris(self, *args, timeout=3600):
        """`morris ARGS` in the client host, with the volume key after ARGS[0] (`cache`)."""
        return self.client.run([MORRIS, args[0], "--key", self.vol.keys.volume, *args[1:]], timeout=timeout).stdout

    def flush(self):
        t = time.perf_counter()
        self.morris("cache", "flush", os.path.join(self.mnt, "c"), "--timeout", "1h")
        return time.perf_counter() - t

    def stop(self):
        if self.vol is not None:
            self.vol.stop()
        if self.ganesha is not None:
            self.ganesha.stop()

    # ------------------------------------------------------------------ the configurations
    def plain_creates(self, rep):
        return {"creates_s": creates(os.path.join(self.mnt, "plain", f"r{rep}"), self.a.files)}

    def cached_creates(self, rep):
        rate = creates(os.path.join(self.mnt, "c", f"r{rep}"), self.a.files)
        secs = self.flush()
        at_home = len(os.listdir(os.path.join(self.export, f"r{rep}")))
        if at_home != self.a.files:
            raise RuntimeError(f"{at_home} of {self.a.files} files at home after the flush")
        return {"creates_s": rate, "burst_to_home_s": secs}

    def plain_write(self, rep):
        d = os.path.join(self.mnt, "plain", f"w{rep}")
        os.mkdir(d)
        return {"mib_s": write_file(os.path.join(d, "big"), self.a.size, seed=7)}

    def cached_write(self, rep):
        d = os.path.join(self.mnt, "c", f"w{rep}")
        os.mkdir(d)
        rate = write_file(os.path.join(d, "big"), self.a.size, seed=7)
        secs = self.flush()
        got = sha256(os.path.join(self.export, f"w{rep}", "big"))
        if got != self.source_sum:
            raise RuntimeError("the drained file differs from the written one")
        return {"mib_s": rate, "drain_s": secs, "drain_mib_s": self.a.size / MiB / secs}

    def direct_write(self, rep):
        t = time.perf_counter()
        self.client.run(["nfs-cp", self.source, self.url(f"direct-r{rep}")], timeout=3600)
        secs = time.perf_counter() - t
        if sha256(os.path.join(self.export, f"direct-r{rep}")) != self.source_sum:
            raise RuntimeError("nfs-cp's copy differs")
        return {"mib_s": self.a.size / MiB / secs, "secs": secs}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--size", type=parse_size, default=parse_size("512M"))
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--server-rate", default="200mbit")
    ap.add_argument("--home-rate", default="800mbit")
    ap.add_argument("--client-rate", default="800mbit")
    ap.add_argument("--prefix", default="cw-")
    ap.add_argument("--subnet", default="10.84.0")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-writeback.json"))
    return ap.parse_args()


def main():
    a = parse_args()
    require_root_and_tools(("nsenter", "nfs-cp"))
    if not os.access(MORRIS, os.X_OK):
        sys.exit(f"error: morris binary {MORRIS} not executable (set MORRIS_EXE)")
    srate, hrate, crate = parse_rate(a.server_rate), parse_rate(a.home_rate), parse_rate(a.client_rate)
    n_hosts = 2 + a.servers
    rates = {0: hrate, 1: crate, **{i: srate for i in range(2, n_hosts)}}
    raw = {x: [] for x in ("plain_creates", "cached_creates", "plain_write", "cached_write", "direct_write")}
    res = {"experiment": "writeback", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "command": "python3 bench/writeback.py " + " ".join(sys.argv[1:]),
           "commit": git("rev-parse", "--short", "HEAD"),
           "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
           "morris_binary": MORRIS, "args": {k: v for k, v in vars(a).items()}, "raw": raw}
    failure = None
    with Cluster(n_hosts, srate, rates=rates, prefix=a.prefix, subnet=a.subnet, ack_prio=True) as cl:
        try:
            res["verify_before"] = cl.verify(log=log)
        except ShapingError as e:
            sys.exit(f"refused: {e}")
        b = Bench(cl, a)
        try:
            b.setup()
            jobs = [(name, getattr(b, name)) for name in raw]
            for rep in range(a.runs):
                k0 = rep % len(jobs)
                for name, job in jobs[k0:] + jobs[:k0]:
                    r = job(rep)
                    log(f"run {rep} {name}: {json.dumps({k: round(v, 2) for k, v in r.items()})}")
                    raw[name].append(r)
        except BaseException as e:
            failure = f"{type(e).__name__}: {e}"
            log(f"FAILED: {failure}")
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            res["log_warnings"] = {h.ns: log_warnings(h.dir) for h in b.servers + [b.client]}
            b.stop()
    if failure is not None:
        res["failure"] = failure
        with open(a.out + ".failed", "w") as f:
            json.dump(res, f, indent=1)
        sys.exit(f"writeback.py: {failure}")
    m = {name: {k: med([r[k] for r in rows]) for k in rows[0]} for name, rows in raw.items()}
    res["medians"] = m
    ratios = {
        "creates cached/plain": m["cached_creates"]["creates_s"] / m["plain_creates"]["creates_s"],
        "write cached/plain": m["cached_write"]["mib_s"] / m["plain_write"]["mib_s"],
        "drain/direct": m["cached_write"]["drain_mib_s"] / m["direct_write"]["mib_s"],
    }
    res["ratios"] = ratios
    table = [
        f"{'':28} {'plain':>10} {'sw cache':>10} {'ratio':>7}  goal",
        f"{'creates/s':28} {m['plain_creates']['creates_s']:>10.0f} {m['cached_creates']['creates_s']:>10.0f} "
        f"{ratios['creates cached/plain']:>7.2f}  >= 0.9",
        f"{'1 MiB writes + fsync, MiB/s':28} {m['plain_write']['mib_s']:>10.1f} {m['cached_write']['mib_s']:>10.1f} "
        f"{ratios['write cached/plain']:>7.2f}  >= 0.9",
        "",
        f"{'':28} {'direct':>10} {'drain':>10} {'ratio':>7}",
        f"{'to home, MiB/s':28} {m['direct_write']['mib_s']:>10.1f} {m['cached_write']['drain_mib_s']:>10.1f} "
        f"{ratios['drain/direct']:>7.2f}  >= 0.9",
        "",
        f"{a.files} creates reach home (flush) in {m['cached_creates']['burst_to_home_s']:.1f} s (median)",
    ]
    res["table"] = table
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    log(f"wrote {a.out}")
    print("\n".join(table))


if __name__ == "__main__":
    main()
