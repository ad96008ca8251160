#!/usr/bin/env python3
"""Cache mode baselines (issue 14): how fast a 500 MiB file can be read from home, over the
emulated cluster's shaped links, directly with libnfs and with morris-home's NfsHome (the fetch
path of one stripe server), without and with 30 ms added to every round trip to home.

    python3 bench/home.py [--size 500M] [--runs 3] [--rate 800mbit] [--delay-ms 15]
                          [--parallel 1,4,8,16] [--nfs-depth 1,4,16] [--home-read PATH]

Topology (bench/cluster, network namespaces + tbf on veths; prefix hb-, subnet 10.81.0):
  hb-h0  "home": nfs-ganesha (bench/lib/ganesha.py, FSAL VFS, Attr_Expiration_Time = 0) exporting
         a directory with one file `big` (--size bytes of seeded pseudo-random data); link --rate
         (default 800 Mbit/s: 4x a 200 Mbit/s stripe server's, as in the issue);
  hb-h1  the reader (the future stripe server / client), link --rate.
  +30 ms: there is no netem here, so bench/lib/delay_relay.py runs inside hb-h0 and relays
         h0:12049 -> h0:2049 (NFS) and h0:30048 -> h0:20048 (MOUNT), holding every chunk
         --delay-ms (15) in each direction: every round trip to home grows by 30 ms; the relay's
         own hop is h0's loopback, so it adds no traffic to the shaped link. See its docstring
         for what a split-TCP relay does not emulate (TCP slow start over the long path).

Readers, run in hb-h1, each reading the whole file once per run:
  libnfs   bench/lib/nfsread.c (as bench/cluster's NFS baseline): 1 MiB READs, --nfs-depth in
           flight (-d 1 is what nfs-cat does);
  NfsHome  crates/morris-home/examples/home_read: N reads of max_read (1 MiB) in flight over
           HomeOptions::parallel = N connections (one call per connection at a time); its
           checksum must equal the one of the file read locally (file:///), every run.
Every configuration runs once per repetition, all of them interleaved (repetition-major, the
order rotated each repetition); figures are medians of --runs. home's page cache stays warm
(the file is read once before): the disk is not what is measured. The link shaping is checked
before and after (bench/cluster's check; a failure refuses the run).

Writes bench/results-home.json (raw per-run figures, machine CPU use per run, bytes on the
reader's link, the measured RTTs, commit, command) and docs/home-baselines.png (if matplotlib
is installed). Needs root, iproute2, nfs-ganesha, rpcbind, libnfs-dev, gcc, cargo.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from cluster.hosts import PAYLOAD_EFF, Cluster, ShapingError, require_root_and_tools  # noqa: E402
from cluster.systems import CpuMeter, MiB, build_nfsread, wait_port, write_file  # noqa: E402
from lib.ganesha import Ganesha  # noqa: E402
from lib.util import parse_size  # noqa: E402

NFS_PORT, MOUNT_PORT = 2049, 20048
RELAY_NFS, RELAY_MOUNT = 12049, 30048


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def git(*args):
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    return r.stdout.strip()


def build_home_read():
    """cargo build the example; returns its path."""
    log("building home_read (cargo build --release -p morris-home --example home_read)")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "morris-home", "--example", "home_read"],
                   cwd=REPO, check=True)
    tgt = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    return os.path.join(tgt, "release", "examples", "home_read")


# RTT of NFS NULL calls on one connection, run inside the reader's host: median and spread.
_RTT = r"""
import socket, statistics, struct, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((addr, port), timeout=5)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def recv(k):
    b = b""
    while len(b) < k:
        x = s.recv(k - len(b))
        if not x: raise SystemExit("closed")
        b += x
    return b
out = []
for i in range(n):
    msg = struct.pack(">IIIIIIIIII", i + 1, 0, 2, 100003, 3, 0, 0, 0, 0, 0)
    t = time.perf_counter()
    s.sendall(struct.pack(">I", 0x80000000 | len(msg)) + msg)
    last = False
    while not last:
        (m,) = struct.unpack(">I", recv(4)); last = bool(m >> 31); recv(m & 0x7fffffff)
    out.append((time.perf_counter() - t) * 1e3)
out.sort()
print(statistics.median(out), out[0], out[-1])
"""


def measure_rtt(client, addr, port, n=50):
    o = client.run(["python3", "-c", _RTT, addr, str(port), str(n)], timeout=60).stdout.split()
    return {"median_ms": float(o[0]), "min_ms": float(o[1]), "max_ms": float(o[2])}


def start_relay(home, delay_ms):
    argv = ["python3", os.path.join(BENCH, "lib", "delay_relay.py"), "--delay-ms", str(delay_ms),
            "--listen", f"{home.addr}:{RELAY_NFS}", "--to", f"{home.addr}:{NFS_PORT}",
            "--listen", f"{home.addr}:{RELAY_MOUNT}", "--to", f"{home.addr}:{MOUNT_PORT}"]
    p = home.spawn(argv, stdout=subprocess.PIPE, stderr=open(os.path.join(home.dir, "relay.log"), "ab"),
                   text=True)
    lines = []
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"delay relay exited ({p.wait()}); see {home.dir}/relay.log")
        if line.strip() == "ready":
            break
        lines.append(line.strip())
    log("\n".join(lines))
    return p


def stop_proc(p):
    """End a process we started (by its PID), SIGKILL after a grace time."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def proc_cpu(pid):
    """User + system CPU seconds of process pid so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def one_run(client, argv, size, servers):
    """Run one reader in the client host; returns its figures (its JSON line), the machine's CPU
    use, the CPU seconds of the reader and of each server process {name: pid}, and the bytes
    that came in on the reader's link."""
    cpu = CpuMeter()
    rx0 = client.link_bytes()[0]
    srv0 = {k: proc_cpu(pid) for k, pid in servers.items()}
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.start()
    t = time.perf_counter()
    r = client.run(argv, check=False, timeout=900)  # nsenter execs the reader: it is our child
    wall = time.perf_counter() - t
    c = cpu.stop()
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = {"reader": ch1.ru_utime + ch1.ru_stime - ch0.ru_utime - ch0.ru_stime,
             **{k: proc_cpu(pid) - srv0[k] for k, pid in servers.items()}}
    rx = client.link_bytes()[0] - rx0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} -> {r.returncode}: {r.stderr.strip()[-1500:]}")
    j = json.loads(r.stdout.strip().splitlines()[-1])
    if int(j["bytes"]) != size:
        raise RuntimeError(f"{argv[0]} read {j['bytes']} bytes of {size}")
    return {"mib_s": float(j["mib_s"]), "secs": float(j["secs"]), "wall_s": round(wall, 3),
            "cpu_busy": round(c["busy"], 3), "cpu_s": {k: round(v, 2) for k, v in procs.items()},
            "rx_MiB": round(rx / MiB, 1),
            **({"sum": j["sum"]} if j.get("sum") else {})}


def plot(res, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no PNG (pip install matplotlib)")
        return None
    cfgs = res["configs"]
    paths = res["paths"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    w = 0.8 / len(paths)
    for k, path in enumerate(paths):
        ys = [res["median"][path][c] for c in cfgs]
        xs = [i + (k - (len(paths) - 1) / 2) * w for i in range(len(cfgs))]
        bars = ax.bar(xs, ys, w, label=res["path_labels"][path])
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.0f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.axhline(res["link_goodput_mib_s"], color="k", ls="--", lw=1,
               label=f"link goodput {res['link_goodput_mib_s']:.1f} MiB/s ({res['args']['rate']})")
    ax.set_xticks(range(len(cfgs)))
    ax.set_xticklabels([res["config_labels"][c] for c in cfgs], fontsize=8)
    ax.set_ylabel("MiB/s (median)")
    ax.set_ylim(0, max(res["link_goodput_mib_s"], *(max(v.values()) for v in res["median"].values())) * 1.22)
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    ax.set_title(f"Reading a {res['args']['size'] // MiB} MiB file from home (nfs-ganesha), {res['date']}, "
                 f"medians of {res['args']['runs']} runs", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    log(f"wrote {out}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("500M"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", default="800mbit", help="the home's link rate (and the reader's, by default)")
    ap.add_argument("--reader-rate", default=None, help="the reader's link rate (e.g. 200mbit: one stripe server's)")
    ap.add_argument("--delay-ms", type=float, default=15.0, help="relay delay each way (15: +30 ms RTT)")
    ap.add_argument("--parallel", default="1,4,8,16", help="home_read reads in flight (= connections)")
    ap.add_argument("--nfs-depth", default="1,4,16", help="libnfs nfsread 1 MiB READs in flight")
    ap.add_argument("--no-relay", action="store_true", help="only the path without added delay")
    ap.add_argument("--home-read", default=None, help="home_read binary (default: cargo build it)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prefix", default="hb-")
    ap.add_argument("--subnet", default="10.81.0")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-home.json"))
    ap.add_argument("--png", default=os.path.join(REPO, "docs", "home-baselines.png"))
    a = ap.parse_args()
    require_root_and_tools(("nsenter", "gcc", "cargo"))
    home_read = a.home_read or build_home_read()
    if not os.access(home_read, os.X_OK):
        sys.exit(f"error: {home_read} is not executable")
    par = [int(x) for x in a.parallel.split(",") if x]
    depths = [int(x) for x in a.nfs_depth.split(",") if x]
    configs = [f"libnfs-d{d}" for d in depths] + [f"home-p{p}" for p in par]
    labels = {**{f"libnfs-d{d}": f"libnfs\n{d} in flight" for d in depths},
              **{f"home-p{p}": f"NfsHome\n{p} conn." for p in par}}
    paths = ["direct"] + ([] if a.no_relay else ["relay"])
    path_labels = {"direct": "home direct (link only)",
                   "relay": f"home +{2 * a.delay_ms:g} ms RTT (delay relay)"}
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    cmd = "python3 bench/home.py " + " ".join(sys.argv[1:])
    raw = {p: {c: [] for c in configs} for p in paths}
    with Cluster(2, a.rate, rates={1: a.reader_rate or a.rate}, prefix=a.prefix, subnet=a.subnet) as cl:
        home, client = cl.hosts
        goodput = min(home.rate, client.rate) * PAYLOAD_EFF / 8 / MiB
        try:
            ver_before = cl.verify(log=log)
        except ShapingError as e:
            sys.exit(f"refused: {e}")
        exp = os.path.join(home.dir, "export")
        os.makedirs(exp)
        log(f"writing {a.size / MiB:.0f} MiB at home")
        write_file(os.path.join(exp, "big"), a.size, seed=a.seed)
        local = json.loads(subprocess.run([home_read, f"file://{exp}", "big", "--parallel", "4"], check=True,
                                          capture_output=True, text=True).stdout.strip().splitlines()[-1])
        ref_sum = local["sum"]
        log(f"checksum of the file read locally: {ref_sum} (home's page cache now warm)")
        nfsread = build_nfsread(cl.workdir)
        g = Ganesha(exp, os.path.join(home.dir, "ganesha"), netns=home.ns, bind_addr=home.addr,
                    port=NFS_PORT, attr_expiration=0)
        relay = None
        try:
            g.start()
            assert g.mount_port == MOUNT_PORT, g.mount_port
            ports = {"direct": (NFS_PORT, MOUNT_PORT)}
            rtt = {"direct": measure_rtt(client, home.addr, NFS_PORT)}
            if "relay" in paths:
                relay = start_relay(home, a.delay_ms)
                wait_port(client, home.addr, RELAY_NFS)
                ports["relay"] = (RELAY_NFS, RELAY_MOUNT)
                rtt["relay"] = measure_rtt(client, home.addr, RELAY_NFS)
            for p, r in rtt.items():
                log(f"NFS NULL round trip, {p}: median {r['median_ms']:.2f} ms "
                    f"(min {r['min_ms']:.2f}, max {r['max_ms']:.2f}; 50 calls)")

            def argv(path, c):
                np, mp = ports[path]
                if c.startswith("libnfs-d"):
                    url = f"nfs://{home.addr}/export/big?version=3&nfsport={np}&mountport={mp}"
                    return [nfsread, "-c", str(MiB), "-d", c[len("libnfs-d"):], url]
                url = f"nfs://{home.addr}/export?nfsport={np}&mountport={mp}"
                return [home_read, url, "big", "--parallel", c[len("home-p"):]]

            order = [(p, c) for p in paths for c in configs]
            for rep in range(a.runs):
                k = rep * len(order) // max(a.runs, 1)
                for p, c in order[k:] + order[:k]:
                    servers = {"ganesha": g.pids["ganesha"], **({"relay": relay.pid} if relay else {})}
                    r = one_run(client, argv(p, c), a.size, servers)
                    if c.startswith("home-") and r.get("sum") != ref_sum:
                        raise RuntimeError(f"{p} {c}: checksum {r.get('sum')} != local {ref_sum}")
                    raw[p][c].append(r)
                    log(f"run {rep + 1}/{a.runs} {p:<6} {c:<11} {r['mib_s']:7.1f} MiB/s  "
                        f"({r['secs']:.2f} s, {r['rx_MiB']:.0f} MiB on the link; machine CPU {r['cpu_busy']:.0%}; CPU s: "
                        + " ".join(f"{k} {v:.2f}" for k, v in r["cpu_s"].items()) + ")")
        finally:
            if relay is not None:
                stop_proc(relay)
            g.stop()
        try:
            ver_after = cl.verify(log=log)
        except ShapingError as e:
            json.dump({"rejected": str(e), "raw": raw}, open(a.out + ".rejected", "w"), indent=1)
            sys.exit(f"refused: {e} (raw figures in {a.out}.rejected)")

    med = {p: {c: statistics.median(x["mib_s"] for x in raw[p][c]) for c in configs} for p in paths}
    ref = {p: med[p][f"libnfs-d{depths[-1]}"] if depths else None for p in paths}
    res = {"experiment": "home-baselines", "date": started, "command": cmd, "commit": git("rev-parse", "--short", "HEAD"),
           "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
           "args": vars(a), "configs": configs, "config_labels": labels, "paths": paths, "path_labels": path_labels,
           "link_goodput_mib_s": goodput, "rtt": rtt, "checksum": ref_sum, "median": med, "raw": raw,
           "verify_before": ver_before, "verify_after": ver_after,
           "machine": {"nproc": os.cpu_count(), "loadavg_end": os.getloadavg()}}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    log(f"wrote {a.out}")
    plot(res, a.png)

    # The table: medians, ratio to the deepest libnfs reader on the same path, share of the link.
    hdr = f"{'reader':<22}" + "".join(f"{'MiB/s ' + p:>14}{'vs libnfs':>10}{'of link':>9}" for p in paths)
    print(f"\n{a.size // MiB} MiB from home over {a.rate} links; medians of {a.runs} runs; "
          f"'vs libnfs' = / libnfs with {depths[-1] if depths else '-'} in flight on the same path; "
          f"link goodput {goodput:.1f} MiB/s (reader link {client.rate / 1e6:g} Mbit/s)")
    print(hdr)
    for c in configs:
        line = f"{labels[c].replace(chr(10), ' '):<22}"
        for p in paths:
            m = med[p][c]
            line += f"{m:>14.1f}{m / ref[p] if ref[p] else float('nan'):>10.2f}{m / goodput:>9.0%}"
        print(line)
    print("RTT (NFS NULL, median): " + ", ".join(f"{p} {r['median_ms']:.2f} ms" for p, r in rtt.items()))
    # A pipeline of N requests of S bytes keeps a link of goodput G busy only if N*S/G >= RTT + S/G.
    for p, r in rtt.items():
        need = 1 + r["median_ms"] / 1e3 * goodput
        print(f"{p}: a request stream fills the link only with N >= 1 + RTT x G / S = {need:.1f} "
              f"1 MiB requests in flight (no slack for jitter or server time)")


if __name__ == "__main__":
    main()
