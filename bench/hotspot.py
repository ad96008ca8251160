#!/usr/bin/env python3
"""Hot-spot experiment (CEFT-PVFS §5, issue 4) on the emulated cluster.

4 morris servers (hosts h0..h3, links --server-rate), 4 client hosts (h4..h7,
links --client-rate, slower than a server's so that the servers have spare
capacity, as in the CEFT runs), each client reading its own file of --size
at once through its own FUSE mount (cold caches). Measured for --replicas 1
and 2, each without and with a hot spot on server h2.

The hot spot: on these machines every "host" shares one disk and one CPU;
only a host's link is its own. A program on h2 that stresses h2's *disk*
(the paper's Figure 8, synchronous 1 MiB appends) would slow all four
servers alike, which is not a hot spot. So the "other application" on h2
here competes for h2's own resource, its link: --stress-streams TCP streams
sending as fast as they can from h2 to a sink host (h8), sharing h2's
shaped uplink with morris (FIFO tbf: roughly by stream count). With
--fig8 the Figure 8 program runs on h2 as well (it loads the shared disk,
i.e. every server; reported for completeness). The hot server is h2, not h1:
h1 owns the root directory (primary of its metadata range), which would add
the lookups of every client to what is measured. --keep-workdir keeps the
servers' and mounts' logs (a lease that lapsed is logged there).

Prints a table (medians of --runs), writes bench/results-hotspot.json and
docs/hotspot.png. Usage (root):
  python3 bench/hotspot.py [--size 256M] [--runs 3] [--server-rate 200mbit]
                           [--client-rate 100mbit] [--stress-streams 6] [--fig8]
"""

import argparse
import json
import os
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

from lib.util import parse_size  # noqa: E402
from cluster.hosts import Cluster, ShapingError, killpg, parse_rate  # noqa: E402
from cluster.systems import MiB, Morris, cold, concurrent_reads, fuse_reader, write_file  # noqa: E402

SINK = r"""
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5301)); s.listen(64)
def drain(c):
    while c.recv(1 << 20): pass
while True:
    c, _ = s.accept(); threading.Thread(target=drain, args=(c,), daemon=True).start()
"""

SENDER = r"""
import socket, sys, threading, time
dst, n = sys.argv[1], int(sys.argv[2])
buf = b"\0" * (1 << 20)
def send():
    while True:
        try:
            c = socket.create_connection((dst, 5301))
            while True: c.sendall(buf)
        except OSError:
            time.sleep(0.2)
for _ in range(n): threading.Thread(target=send, daemon=True).start()
print("ready", flush=True)
while True: time.sleep(3600)
"""

FIG8 = r"""
import os, sys
# CEFT-PVFS Figure 8: append 1 MiB synchronously, over and over.
path = sys.argv[1]; buf = os.urandom(1 << 20); n = 0
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_SYNC, 0o644)
while True:
    os.write(fd, buf); n += 1
    if n % 512 == 0:
        os.ftruncate(fd, 0)
"""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def start_stress(cl, hot, sink, a):
    procs = [sink.spawn(["python3", "-c", SINK], log=os.path.join(sink.dir, "sink.log"))]
    time.sleep(0.5)
    import subprocess
    p = hot.spawn(["python3", "-c", SENDER, sink.addr, str(a.stress_streams)],
                  stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        raise RuntimeError("stress sender did not start")
    procs.append(p)
    if a.fig8:
        procs.append(hot.spawn(["python3", "-c", FIG8, os.path.join(hot.dir, "fig8.dat")]))
    time.sleep(2)  # let the streams fill the link
    return procs


def stop_stress(procs):
    for p in procs:
        killpg(p)
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("256M"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--server-rate", default="200mbit")
    ap.add_argument("--client-rate", default="100mbit")
    ap.add_argument("--stress-streams", type=int, default=6)
    ap.add_argument("--fig8", action="store_true", help="also run the Figure 8 disk program on the hot server")
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--prefix", default="mh-")
    ap.add_argument("--subnet", default="10.79.0")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-hotspot.json"))
    ap.add_argument("--plot", default=os.path.join(os.path.dirname(BENCH), "docs", "hotspot.png"))
    ap.add_argument("--keep-workdir", action="store_true", help="keep server and mount logs (path printed)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("hotspot.py: needs root (namespaces, tc, FUSE)")
    srate, crate = parse_rate(a.server_rate), parse_rate(a.client_rate)
    rates = {i: (srate if i < 4 else crate) for i in range(9)}
    rates[8] = srate
    results = {}
    with Cluster(9, srate, rates=rates, prefix=a.prefix, subnet=a.subnet,
                 keep_workdir=a.keep_workdir) as cl:
        srv, cli, sink = cl.hosts[:4], cl.hosts[4:8], cl.hosts[8]
        hot = srv[2]  # not the root directory's owner (server 1): see docs/benchmarks.md
        cl.verify(log=log)
        for r in [int(x) for x in a.replicas.split(",")]:
            mo = Morris(cl, srv, port=7710 + r, replicas=r)
            try:
                m = mo.mount(cli[0])
                owners = {}
                for i in range(4):
                    write_file(os.path.join(m, f"f{i}"), a.size, seed=i + 1)
                    # The inode (and the file's leases) live on server id mod k
                    # (the primary of that metadata range).
                    owners[f"f{i}"] = srv[os.stat(os.path.join(m, f"f{i}")).st_ino % len(srv)].ns
                log(f"replicas={r}: inode owners {owners} (hot server {hot.ns})")
                results[f"replicas={r} inode owners"] = owners
                mo.umount_all()
                for stressed in (False, True):
                    key = f"replicas={r} {'hot spot' if stressed else 'no stress'}"
                    runs = []
                    for run in range(a.runs):
                        stress = start_stress(cl, hot, sink, a) if stressed else []
                        try:
                            cold()
                            jobs = [fuse_reader(h, os.path.join(mo.mount(h), f"f{i}")) for i, h in enumerate(cli)]
                            res = concurrent_reads(jobs, expect_size=a.size)
                        finally:
                            mo.umount_all()
                            stop_stress(stress)
                        served = {h.ns: round(res["links"][h.ns]["tx_MiB"], 1) for h in srv}
                        log(f"{key} run {run + 1}: aggregate {res['aggregate']:.1f} MiB/s, "
                            f"per client {[round(x, 1) for x in res['per_client']]}, server tx MiB {served}")
                        runs.append({"aggregate": res["aggregate"], "per_client": res["per_client"],
                                     "server_tx_MiB": served, "cpu": res["cpu"]})
                    results[key] = runs
            finally:
                mo.stop()
        cl.verify(log=log)
    owners = {k: results.pop(k) for k in [k for k in results if k.endswith("inode owners")]}
    med = {k: statistics.median(x["aggregate"] for x in v) for k, v in results.items()}
    print(f"\nhot spot: {a.stress_streams} TCP streams out of server {hot.ns}"
          f"{' + Figure 8 appends' if a.fig8 else ''}; 4 readers x {a.size // MiB} MiB; "
          f"servers {a.server_rate}, clients {a.client_rate}; medians of {a.runs}")
    print(f"{'configuration':<28} {'aggregate MiB/s':>16}")
    for k, v in med.items():
        print(f"{k:<28} {v:>16.1f}")
    for r in [int(x) for x in a.replicas.split(",")]:
        ok, hs = med.get(f"replicas={r} no stress"), med.get(f"replicas={r} hot spot")
        if ok and hs:
            print(f"replicas={r}: hot spot keeps {100 * hs / ok:.0f} % of the unstressed throughput")
    if "replicas=1 no stress" in med and "replicas=2 no stress" in med:
        print(f"replicas=2 / replicas=1 without stress: {med['replicas=2 no stress'] / med['replicas=1 no stress']:.2f}")
    data = {"date": time.strftime("%Y-%m-%d"), "command": "python3 bench/hotspot.py " + " ".join(sys.argv[1:]),
            "args": vars(a), "median_aggregate": med, "inode_owners": owners, "runs": results}
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
    log(f"wrote {a.out}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        keys = list(med)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar(range(len(keys)), [med[k] for k in keys],
               color=["#4c72b0" if "no stress" in k else "#dd8452" for k in keys])
        ax.set_xticks(range(len(keys)), [k.replace(" ", "\n", 1) for k in keys], fontsize=8)
        ax.set_ylabel("aggregate MiB/s (4 readers)")
        ax.set_title(f"hot spot on one of 4 servers ({time.strftime('%Y-%m-%d')})")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        log(f"wrote {a.plot}")
    except ImportError:
        log("matplotlib missing: no plot")


if __name__ == "__main__":
    try:
        main()
    except ShapingError as e:
        sys.exit(f"hotspot.py: link shaping is off, refusing to report: {e}")
