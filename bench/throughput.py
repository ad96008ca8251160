#!/usr/bin/env python3
"""morris throughput benchmark (issue 2), side by side with the local disk.

Starts a k-server morris cluster on loopback (real `morris server` processes),
mounts it with FUSE, and measures, in the same run and on the same disk:

  seq-write      sequential write of SIZE through the mount, 1 MiB writes + fsync
  cold-read      single-stream sequential read, every page cache dropped first
  warm-srv-read  servers' page caches warm, client cold (fresh mount)
  tcp-copy       raw loopback TCP copy of SIZE (reference for warm-srv-read)
  4proc-1mount   4 processes reading the same file through one mount (cold client)
  4mounts        4 separate mounts, one reader each, at once (cold clients)
  rand-4k        4 KiB random reads (cold caches), IOPS
  create/stat/unlink  of N empty files, per second
  cp-r           cp -r of 2,000 small files (4-64 KiB) + sync, seconds
  req/READ       server request counters during a sequential read

Each figure is the median of --runs runs. Prints a table, writes JSON.
Needs root (drop_caches) and FUSE. Usage:
  python3 bench/throughput.py [--servers 4] [--size 2G] [--runs 3] [--out bench/results.json]
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from lib.loopback import make_keys  # noqa: E402
from lib.util import drop_caches, free_port, parse_size, wait_mounted  # noqa: E402


class Cluster:
    def __init__(self, exe, base, k, unit, keys, lease_ms=10000):
        """keys: make_keys(); servers, format and status get the volume key, mounts the client key."""
        self.exe, self.base, self.k, self.keys = exe, base, k, keys
        self.procs, self.addrs, self.mounts = [], [], []
        for i in range(k):
            port = free_port()
            d = os.path.join(base, f"server-{i}")
            os.makedirs(d, exist_ok=True)
            log = open(os.path.join(base, f"server-{i}.log"), "ab")
            p = subprocess.Popen([exe, "server", "--key", keys.volume, "--data", d, "--listen", f"127.0.0.1:{port}",
                                  "--lease-ms", str(lease_ms)], stdout=log, stderr=log)
            self.procs.append(p)
            self.addrs.append(f"127.0.0.1:{port}")
        for a in self.addrs:
            host, port = a.split(":")
            for _ in range(200):
                try:
                    socket.create_connection((host, int(port)), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        args = [exe, "format", "--key", keys.volume, "--servers", ",".join(self.addrs)]
        if unit:
            args += ["--stripe-unit", unit]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)

    def mount(self, path):
        os.makedirs(path, exist_ok=True)
        log = open(os.path.join(self.base, "mount.log"), "ab")
        p = subprocess.Popen([self.exe, "mount", "--key", self.keys.client, self.addrs[0], path],
                             stdout=log, stderr=log)
        wait_mounted(path, p, f"{self.base}/mount.log")
        self.mounts.append((path, p))
        return path

    def umount(self, path):
        for i, (m, p) in enumerate(self.mounts):
            if m == path:
                subprocess.run(["fusermount3", "-u", m], check=False)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                del self.mounts[i]
                return

    def status(self):
        out = subprocess.run([self.exe, "status", "--key", self.keys.volume, self.addrs[0], "--json"], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)

    def stop(self):
        for m, _ in list(self.mounts):
            self.umount(m)
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def write_file(path, size, bs=MiB):
    buf = os.urandom(bs)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, buf[: min(bs, left)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return size / MiB / (time.perf_counter() - t)


def read_file(path, bs=MiB):
    fd = os.open(path, os.O_RDONLY)
    n = 0
    t = time.perf_counter()
    try:
        while True:
            b = os.read(fd, bs)
            if not b:
                break
            n += len(b)
    finally:
        os.close(fd)
    return n / MiB / (time.perf_counter() - t), n


def parallel_reads(paths):
    results = [None] * len(paths)

    def one(i, p):
        results[i] = read_file(p)

    t = time.perf_counter()
    th = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(paths)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    el = time.perf_counter() - t
    total = sum(r[1] for r in results)
    return total / MiB / el, [r[0] for r in results]


def parallel_procs(path, n):
    # Separate processes, as separate applications would be.
    code = ("import os,sys,time\nfd=os.open(sys.argv[1],os.O_RDONLY)\nn=0\n"
            "while True:\n b=os.read(fd,1<<20)\n if not b: break\n n+=len(b)\nprint(n)\n")
    t = time.perf_counter()
    ps = [subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
          for _ in range(n)]
    total = sum(int(p.communicate()[0]) for p in ps)
    return total / MiB / (time.perf_counter() - t)


def rand_reads(path, size, count, bs=4096, seed=1):
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    t = time.perf_counter()
    try:
        for _ in range(count):
            off = rng.randrange(0, size - bs) // bs * bs
            os.pread(fd, bs, off)
    finally:
        os.close(fd)
    el = time.perf_counter() - t
    return count / el


def tcp_copy(size):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got = [0]

    def sink():
        c, _ = srv.accept()
        buf = bytearray(MiB)
        while True:
            n = c.recv_into(buf)
            if n == 0:
                break
            got[0] += n
        c.close()

    th = threading.Thread(target=sink)
    th.start()
    s = socket.create_connection(("127.0.0.1", port))
    buf = b"x" * MiB
    t = time.perf_counter()
    left = size
    while left > 0:
        s.sendall(buf[: min(MiB, left)])
        left -= MiB
    s.close()
    th.join()
    el = time.perf_counter() - t
    srv.close()
    return got[0] / MiB / el


def meta(dirpath, n):
    os.makedirs(dirpath, exist_ok=True)
    names = [os.path.join(dirpath, f"f{i:06d}") for i in range(n)]
    t = time.perf_counter()
    for p in names:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    c = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for p in names:
        os.stat(p)
    s = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for p in names:
        os.unlink(p)
    u = n / (time.perf_counter() - t)
    os.rmdir(dirpath)
    return c, s, u


def make_small_tree(src, n=2000, seed=7):
    rng = random.Random(seed)
    for i in range(n):
        d = os.path.join(src, f"d{i // 100:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"s{i:05d}"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(4 << 10, 64 << 10)))


def cp_r(src, dst):
    t = time.perf_counter()
    subprocess.run(["cp", "-r", src, dst], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t


def op_counts(st):
    out = {}
    for srv in st.get("servers", []):
        for name, n in (srv.get("stats") or {}).get("requests_by_op", []):
            out[name] = out.get(name, 0) + n
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--size", default="2G")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stripe-unit", default="")
    ap.add_argument("--meta-files", type=int, default=10000)
    ap.add_argument("--rand-reads", type=int, default=4000)
    ap.add_argument("--dir", default="", help="work dir on the disk under test (default: a temp dir under /var/tmp)")
    ap.add_argument("--exe", default=os.path.join(ROOT, "target", "release", "morris"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results-throughput.json"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (drop_caches, FUSE allow_other)")
    if not os.path.exists(a.exe):
        subprocess.run(["cargo", "build", "--release", "-p", "morris-cli"], cwd=ROOT, check=True)
    size = parse_size(a.size)
    base = a.dir or tempfile.mkdtemp(prefix="morris-bench-", dir="/var/tmp")
    local = os.path.join(base, "local")
    os.makedirs(local, exist_ok=True)
    keys = make_keys(a.exe, os.path.join(base, "keys"))
    cl = Cluster(a.exe, os.path.join(base, "cluster"), a.servers, a.stripe_unit, keys)
    res = {k: {"morris": [], "local": []} for k in
           ["seq-write", "cold-read", "warm-srv-read", "4proc-1mount", "4mounts", "rand-4k-iops",
            "create", "stat", "unlink", "cp-r-secs"]}
    res["tcp-copy"] = {"ref": []}
    res["one-mount-read"] = {"morris": []}
    reqs = []
    mnts = [os.path.join(base, f"mnt{i}") for i in range(4)]
    try:
        m = cl.mount(mnts[0])
        src = os.path.join(base, "small-src")
        make_small_tree(src)
        for run in range(a.runs):
            print(f"run {run + 1}/{a.runs}", file=sys.stderr)
            mf, lf = os.path.join(m, "big"), os.path.join(local, "big")
            res["seq-write"]["morris"].append(write_file(mf, size))
            res["seq-write"]["local"].append(write_file(lf, size))
            # Cold: every cache on the machine dropped; fresh mount = cold client.
            cl.umount(m); drop_caches(); m = cl.mount(mnts[0])
            before = op_counts(cl.status())
            r, n = read_file(mf)
            after = op_counts(cl.status())
            res["cold-read"]["morris"].append(r)
            reqs.append({k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
                        | {"fuse_reads_1MiB": n // MiB})
            drop_caches()
            res["cold-read"]["local"].append(read_file(lf)[0])
            # Servers warm, client cold: read once, remount, read again.
            read_file(mf)
            cl.umount(m); m = cl.mount(mnts[0])
            res["warm-srv-read"]["morris"].append(read_file(mf)[0])
            res["warm-srv-read"]["local"].append(read_file(lf)[0])  # local page cache warm
            res["tcp-copy"]["ref"].append(tcp_copy(size))
            # 4 processes, one mount (client cold, servers warm).
            cl.umount(m); m = cl.mount(mnts[0])
            res["4proc-1mount"]["morris"].append(parallel_procs(mf, 4))
            res["4proc-1mount"]["local"].append(parallel_procs(lf, 4))
            # 4 mounts, one reader each, vs one mount alone (servers warm, clients cold).
            cl.umount(m); m = cl.mount(mnts[0])
            res["one-mount-read"]["morris"].append(read_file(mf)[0])
            cl.umount(m)
            ms = [cl.mount(p) for p in mnts]
            agg, _ = parallel_reads([os.path.join(p, "big") for p in ms])
            res["4mounts"]["morris"].append(agg)
            for p in ms[1:]:
                cl.umount(p)
            m = ms[0]
            res["4mounts"]["local"].append(parallel_reads([lf] * 4)[0])
            # Random 4 KiB reads, cold.
            cl.umount(m); drop_caches(); m = cl.mount(mnts[0])
            res["rand-4k-iops"]["morris"].append(rand_reads(mf, size, a.rand_reads))
            drop_caches()
            res["rand-4k-iops"]["local"].append(rand_reads(lf, size, a.rand_reads))
            # Metadata.
            for where, d in (("morris", os.path.join(m, "meta")), ("local", os.path.join(local, "meta"))):
                c, s, u = meta(d, a.meta_files)
                res["create"][where].append(c)
                res["stat"][where].append(s)
                res["unlink"][where].append(u)
            for where, d in (("morris", os.path.join(m, f"cp{run}")), ("local", os.path.join(local, f"cp{run}"))):
                res["cp-r-secs"][where].append(cp_r(src, d))
                shutil.rmtree(d)
            os.unlink(mf)
            os.unlink(lf)
    finally:
        cl.stop()
    med = {k: {w: statistics.median(v) for w, v in d.items() if v} for k, d in res.items()}
    print(f"\nmorris {a.servers} servers on loopback, file {size / MiB:.0f} MiB, median of {a.runs} runs")
    print(f"{'workload':<16}{'morris':>12}{'reference':>12}{'ratio':>8}")
    for k, d in med.items():
        ref = d.get("local", d.get("ref"))
        mor = d.get("morris")
        if k == "tcp-copy":
            print(f"{k:<16}{'':>12}{ref:>12.0f}")
            continue
        if mor is None:
            continue
        ratio = mor / ref if ref else float("nan")
        print(f"{k:<16}{mor:>12.0f}{ref if ref is not None else float('nan'):>12.0f}{ratio:>8.2f}")
    warm = med["warm-srv-read"]["morris"] / med["tcp-copy"]["ref"]
    four = med["4mounts"]["morris"] / med["one-mount-read"]["morris"]
    print(f"\n(b) warm-server read / raw TCP copy: {warm:.2f}")
    print(f"(c) 4 mounts aggregate / 1 mount:    {four:.2f}")
    print("(e) requests during one cold sequential read:", json.dumps(reqs[-1] if reqs else {}))
    with open(a.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "args": vars(a), "raw": res, "median": med,
                   "requests_per_read": reqs}, f, indent=1)
    print(f"wrote {a.out}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
