#!/usr/bin/env python3
"""The MORRIS paper's Figure 4 on loopback: N = 1..4 NFS clients reading the same file at once.

morris:  a --servers (4) server volume on loopback (real `morris server` processes + `morris
         format`); one file of --size written through an NFS gateway. For each N, N fresh
         `morris nfs` gateways (one per simulated client, each on its own port, so each starts
         with a cold cache) and N concurrent libnfs readers, reader i through gateway i.
ganesha: one nfs-ganesha (bench/lib/ganesha.py, FSAL VFS, NFSv3) exporting a local directory
         holding the same bytes, read by N concurrent libnfs readers the same way.

Every reader is bench/lib/nfsread.c (compiled at start with gcc -lnfs): mount + open, wait until
all N are ready, then READ the whole file in --chunk (1 MiB) calls, --depth (1) in flight,
copying the data into a buffer. Page cache dropped before every measurement (servers and ganesha
read from disk). Per-client MiB/s = size / that reader's time; aggregate = N * size / (last end -
first start). The two systems alternate inside each run (same conditions); medians of --runs.

Also recorded per measurement: CPU seconds used during the read by each group of processes
(morris servers, gateways, ganesha, readers; /proc/<pid>/stat and getrusage), the machine's
busy/steal share (/proc/stat), and the morris servers' request counters (`morris status
--json`), i.e. server requests per NFS READ.

Needs root (drop_caches, namespaces for ganesha), gcc, libnfs-dev, nfs-ganesha, rpcbind,
matplotlib (for the PNG). Usage:
  python3 bench/nfs_fig4.py [--size 1G] [--runs 3] [--servers 4] [--max-clients 4]
      [--depth 1] [--wait-idle SECS] [--out bench/results-nfs-fig4.json] [--png docs/nfs-fig4.png]
On a shared machine, --wait-idle 300 waits (up to 300 s) before each measurement until other
processes use < 25% of one core; their CPU use during each measurement is recorded either way.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from lib.ganesha import Ganesha  # noqa: E402
from lib.loopback import make_keys  # noqa: E402
from lib.util import drop_caches, free_port, parse_size  # noqa: E402

MiB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def wait_port(port, proc, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


def stop_proc(p, timeout=15):
    """SIGTERM, wait, SIGKILL: only processes this script started (by Popen handle)."""
    if p is None or p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)
    except ProcessLookupError:
        pass


def proc_cpu(pid):
    """user+sys CPU seconds of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def all_cpu():
    """{pid: (comm, cpu seconds)} of every process (threads included in their process)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                raw = f.read()
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            rest = raw.rsplit(")", 1)[1].split()
            out[int(d)] = (comm, (int(rest[11]) + int(rest[12])) / TICK)
        except (OSError, ValueError, IndexError):
            pass
    return out


def top_others(before, after, ours, k=6):
    """CPU seconds of processes outside `ours` between two all_cpu() snapshots, by command name."""
    by = {}
    for pid, (comm, t) in after.items():
        if pid in ours or pid not in before:  # new processes: unknown share of the window
            continue
        d = t - before[pid][1]
        if d > 0:
            by[comm] = by.get(comm, 0.0) + d
    return dict(sorted(by.items(), key=lambda kv: -kv[1])[:k])


def background_load(wait, sample=3.0, limit=25.0):
    """CPU use of all other processes (% of one core over `sample` s); waits up to `wait` s for < limit."""
    deadline = time.time() + wait
    while True:
        a0 = all_cpu()
        time.sleep(sample)
        a1 = all_cpu()
        top = top_others(a0, a1, {os.getpid()}, k=4)
        pct = 100 * sum(top_others(a0, a1, {os.getpid()}, k=10 ** 6).values()) / sample
        if pct < limit or time.time() >= deadline:
            return {"pct_of_one_core": pct, "top": {k: round(100 * v / sample) for k, v in top.items()}}


def sys_cpu():
    """(busy, steal, total) jiffies from /proc/stat, all CPUs."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, sum(v[:8])


class Morris:
    def __init__(self, exe, base, k, keys_dir):
        self.exe, self.base, self.k, self.keys_dir = exe, base, k, keys_dir
        self.keys = None  # made (or reused) by start(): servers/format/status the volume key, gateways the client key
        self.servers, self.addrs, self.gateways = [], [], []
        self.logs = []

    def _log(self, name):
        f = open(os.path.join(self.base, name), "ab")
        self.logs.append(f)
        return f

    def start(self):
        self.keys = make_keys(self.exe, self.keys_dir)
        for i in range(self.k):
            port = free_port()
            d = os.path.join(self.base, f"server-{i}")
            log = self._log(f"server-{i}.log")
            p = subprocess.Popen([self.exe, "server", "--key", self.keys.volume, "--data", d,
                                  "--listen", f"127.0.0.1:{port}"],
                                 stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            self.servers.append(p)
            self.addrs.append(f"127.0.0.1:{port}")
            wait_port(port, p, f"morris server {i}")
        subprocess.run([self.exe, "format", "--key", self.keys.volume, "--servers", ",".join(self.addrs)], check=True,
                       stdout=subprocess.DEVNULL)

    def start_gateways(self, n):
        gws = []
        for i in range(n):
            port = free_port()
            log = self._log(f"gateway-{len(self.logs)}.log")
            p = subprocess.Popen([self.exe, "nfs", "--key", self.keys.client, self.addrs[i % self.k],
                                  "--listen", f"127.0.0.1:{port}"],
                                 stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            self.gateways.append(p)
            gws.append((p, port))
        for p, port in gws:
            wait_port(port, p, "morris nfs gateway")
        return gws

    def stop_gateways(self):
        for p in self.gateways:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.gateways:
            stop_proc(p, timeout=20)
        self.gateways = []

    def counters(self):
        out = subprocess.run([self.exe, "status", "--key", self.keys.volume, self.addrs[0], "--json"], check=True,
                             capture_output=True, text=True).stdout
        st = json.loads(out)
        c = {}
        for srv in st.get("servers", []):
            stats = srv.get("stats") or {}
            for name, n in stats.get("requests_by_op", []):
                c[f"{srv['index']}:{name}"] = n
        return c

    def stop(self):
        self.stop_gateways()
        for p in self.servers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.servers:
            stop_proc(p)
        self.servers = []
        for f in self.logs:
            f.close()
        self.logs = []


def url_morris(port, name):
    # nfs://host//name: libnfs then mounts "/" (an empty export path is refused by some servers).
    return f"nfs://127.0.0.1//{name}?version=3&nfsport={port}&mountport={port}"


def run_readers(reader, urls, chunk, depth, groups):
    """Start one reader per URL, release them together, return (results, cpu by group, sys share).

    groups: {name: [pid, ...]} of server-side processes whose CPU is sampled over the read."""
    procs = []
    try:
        for u in urls:
            procs.append(subprocess.Popen([reader, "-w", "-c", str(chunk), "-d", str(depth), u],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        for p, u in zip(procs, urls):
            line = p.stdout.readline().strip()
            if line != "ready":
                p.wait(timeout=30)
                raise RuntimeError(f"reader for {u} failed before reading: {p.stderr.read().strip()}")
        before = {g: [proc_cpu(pid) for pid in pids] for g, pids in groups.items()}
        a0 = all_cpu()
        s0 = sys_cpu()
        w0 = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = []
        for p, u in zip(procs, urls):
            out, err = p.communicate(timeout=3600)
            if p.returncode != 0:
                raise RuntimeError(f"reader for {u} exited {p.returncode}: {err.strip()}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        wall = time.perf_counter() - w0
        s1 = sys_cpu()
        a1 = all_cpu()
        cpu = {}
        for g, pids in groups.items():
            tot = 0.0
            for pid, b in zip(pids, before[g]):
                a = proc_cpu(pid)
                if a is None or b is None:
                    raise RuntimeError(f"process {pid} ({g}) died during the read")
                tot += a - b
            cpu[g] = tot
        cpu["readers"] = sum(o["cpu"] for o in outs)
        busy, steal, total = (s1[i] - s0[i] for i in range(3))
        ncpu = os.cpu_count() or 1
        machine = {"wall": wall, "busy_cpu_s": busy / TICK, "steal_cpu_s": steal / TICK,
                   "busy_frac": busy / total if total else float("nan"),
                   "steal_frac": steal / total if total else float("nan"), "ncpu": ncpu}
        machine["other_cpu_s"] = machine["busy_cpu_s"] - sum(cpu.values())
        ours = {pid for pids in groups.values() for pid in pids} | {p.pid for p in procs} | {os.getpid()}
        machine["top_other_cpu_s"] = top_others(a0, a1, ours)
        return outs, cpu, machine
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def summarize(outs, size):
    t0 = min(o["t0"] for o in outs)
    t1 = max(o["t1"] for o in outs)
    per = [o["mib_s"] for o in outs]
    for o in outs:
        if o["bytes"] != size:
            raise RuntimeError(f"reader read {o['bytes']} bytes, expected {size}")
    return {"per_client": per, "per_client_mean": statistics.mean(per), "per_client_min": min(per),
            "aggregate": len(outs) * size / MiB / (t1 - t0), "span_s": t1 - t0}


def write_local(path, size):
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(MiB, left)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())


def plot(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib missing (pip install matplotlib): cannot write the PNG")
    ns = res["clients"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, key, title in ((axes[0], "per_client_mean", "per-client read rate"),
                           (axes[1], "aggregate", "aggregate read rate")):
        for sysname, style, label in (("morris", "o-", f"morris ({res['args']['servers']} servers, "
                                                       "1 gateway per client)"),
                                      ("ganesha", "s--", "nfs-ganesha (1 server, local dir)")):
            med = [res["median"][sysname][str(n)][key] for n in ns]
            runs = [[r[key] for r in res["runs"][sysname][str(n)]] for n in ns]
            lo = [m - min(r) for m, r in zip(med, runs)]
            hi = [max(r) - m for m, r in zip(med, runs)]
            ax.errorbar(ns, med, yerr=[lo, hi], fmt=style, capsize=3, label=label)
        ax.set_xticks(ns)
        ax.set_xlabel("concurrent clients (readers of the same file)")
        ax.set_ylabel("MiB/s")
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Figure 4 on loopback: {res['size_mib']:.0f} MiB file, libnfs readers, "
                 f"{res['date']}, median of {res['args']['runs']} runs (bars: min-max), 2-core VM")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--max-clients", type=int, default=4)
    ap.add_argument("--chunk", default="1M", help="bytes per READ call of a reader")
    ap.add_argument("--depth", type=int, default=1, help="READ calls in flight per reader")
    ap.add_argument("--wait-idle", type=float, default=0,
                    help="before the benchmark and before every measurement, wait up to this many seconds "
                         "for the other processes on the machine to use < 25%% of one core (0: do not wait)")
    ap.add_argument("--exe", default="/work/bin/morris")
    ap.add_argument("--dir", default="", help="work dir (default: a temp dir under /var/tmp)")
    ap.add_argument("--out", default=os.path.join(HERE, "results-nfs-fig4.json"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "nfs-fig4.png"))
    a = ap.parse_args()

    if os.geteuid() != 0:
        sys.exit("needs root (drop_caches, namespaces for ganesha)")
    for tool in ("gcc", "unshare", "nsenter", "nfs-cp"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} missing")
    if not os.access(a.exe, os.X_OK):
        sys.exit(f"morris binary {a.exe} missing")
    if not os.path.exists("/usr/include/nfsc/libnfs.h"):
        sys.exit("libnfs-dev missing (/usr/include/nfsc/libnfs.h)")
    try:
        import matplotlib  # noqa: F401  (fail before a long run, not after)
    except ImportError:
        sys.exit("matplotlib missing (pip install matplotlib)")
    size, chunk = parse_size(a.size), parse_size(a.chunk)
    ns = list(range(1, a.max_clients + 1))

    base = a.dir or tempfile.mkdtemp(prefix="morris-fig4-", dir="/var/tmp")
    os.makedirs(base, exist_ok=True)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: it may arrive ignored
        signal.signal(s, on_signal)

    bg = background_load(a.wait_idle)
    print(f"background load before the benchmark: {bg['pct_of_one_core']:.0f}% of one core "
          f"(top: {bg['top']})", file=sys.stderr)

    reader = os.path.join(base, "nfsread")
    subprocess.run(["gcc", "-O2", "-Wall", "-o", reader, os.path.join(HERE, "lib", "nfsread.c"), "-lnfs"],
                   check=True)
    morris = Morris(a.exe, os.path.join(base, "morris"), a.servers, os.path.join(base, "keys"))
    os.makedirs(morris.base, exist_ok=True)
    export = os.path.join(base, "export")
    os.makedirs(export)
    gan = Ganesha(export, os.path.join(base, "ganesha"), port=free_port())
    runs = {"morris": {str(n): [] for n in ns}, "ganesha": {str(n): [] for n in ns}}
    ok = interrupted = False
    try:
        # The file: random bytes on the local disk (ganesha's export), copied into morris.
        local = os.path.join(export, "big")
        print(f"writing {size / MiB:.0f} MiB test file", file=sys.stderr)
        write_local(local, size)
        morris.start()
        gan.start()
        ((gp, gport),) = morris.start_gateways(1)
        t = time.perf_counter()
        subprocess.run(["nfs-cp", local, url_morris(gport, "big")], check=True, stdout=subprocess.DEVNULL)
        write_rate = size / MiB / (time.perf_counter() - t)
        morris.stop_gateways()
        # Check the bytes end to end once: same checksum through both servers.
        ((gp, gport),) = morris.start_gateways(1)
        sums = {}
        for name, u in (("morris", url_morris(gport, "big")), ("ganesha", gan.url("big"))):
            r = subprocess.run([reader, "-s", u], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{name} checksum read failed: {r.stderr.strip()}")
            o = json.loads(r.stdout)
            if o["size"] != size:
                raise RuntimeError(f"{name}: file has {o['size']} bytes, expected {size}")
            sums[name] = o["sum"]
        morris.stop_gateways()
        if sums["morris"] != sums["ganesha"]:
            raise RuntimeError(f"data differs between morris and ganesha: {sums}")
        print(f"file written to morris at {write_rate:.0f} MiB/s (nfs-cp); checksums match ({sums['morris']})",
              file=sys.stderr)

        for run in range(a.runs):
            for n in ns:
                # morris: n fresh gateways, n readers.
                gws = morris.start_gateways(n)
                bgm = background_load(a.wait_idle, sample=1.0) if a.wait_idle else None
                drop_caches()
                c0 = morris.counters()
                outs, cpu, mach = run_readers(
                    reader, [url_morris(port, "big") for _, port in gws], chunk, a.depth,
                    {"servers": [p.pid for p in morris.servers], "gateways": [p.pid for p, _ in gws]})
                c1 = morris.counters()
                morris.stop_gateways()
                delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1 if c1.get(k, 0) != c0.get(k, 0)}
                by_op, by_server = {}, {}
                for k, v in delta.items():
                    srv, op = k.split(":", 1)
                    if op in ("Status", "Hello"):  # `morris status` itself sends these
                        continue
                    by_op[op] = by_op.get(op, 0) + v
                    by_server[srv] = by_server.get(srv, 0) + v
                nfs_reads = sum(o["reads"] for o in outs)
                rec = summarize(outs, size) | {"cpu_s": cpu, "machine": mach, "server_requests": by_op, "counter_delta_raw": delta,
                                                "server_requests_by_server": by_server, "nfs_reads": nfs_reads,
                                                "requests_per_nfs_read": sum(by_op.values()) / nfs_reads}
                rec["background_before"] = bgm
                runs["morris"][str(n)].append(rec)
                # ganesha: same file bytes, n readers on the one server.
                bgg = background_load(a.wait_idle, sample=1.0) if a.wait_idle else None
                drop_caches()
                outs, cpu, mach = run_readers(reader, [gan.url("big")] * n, chunk, a.depth,
                                              {"ganesha": [gan.pids["ganesha"]]})
                grec = summarize(outs, size) | {"cpu_s": cpu, "machine": mach,
                                                 "nfs_reads": sum(o["reads"] for o in outs)}
                grec["background_before"] = bgg
                runs["ganesha"][str(n)].append(grec)
                print(f"run {run + 1}/{a.runs} N={n}: morris per-client {rec['per_client_mean']:.0f} "
                      f"agg {rec['aggregate']:.0f} MiB/s ({rec['requests_per_nfs_read']:.2f} req/READ) | "
                      f"ganesha per-client {grec['per_client_mean']:.0f} agg {grec['aggregate']:.0f} MiB/s",
                      file=sys.stderr)
        ok = True
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        morris.stop()
        gan.stop()
        if ok or interrupted:
            shutil.rmtree(base, ignore_errors=True)
        else:  # keep the logs, not the data
            for d in [export] + [os.path.join(morris.base, f"server-{i}") for i in range(a.servers)]:
                shutil.rmtree(d, ignore_errors=True)
            print(f"failed: logs kept in {base}", file=sys.stderr)

    keys = ("per_client_mean", "per_client_min", "aggregate")
    med = {s: {str(n): {k: statistics.median(r[k] for r in runs[s][str(n)]) for k in keys}
               for n in ns} for s in runs}
    for n in ns:
        rs = runs["morris"][str(n)]
        med["morris"][str(n)]["requests_per_nfs_read"] = statistics.median(r["requests_per_nfs_read"] for r in rs)
        for s in runs:
            rs = runs[s][str(n)]
            groups = rs[0]["cpu_s"].keys()
            med[s][str(n)]["cpu_pct_of_wall"] = {
                g: statistics.median(100 * r["cpu_s"][g] / r["machine"]["wall"] for r in rs) for g in groups}
            med[s][str(n)]["cpu_pct_of_wall"]["other (not this benchmark)"] = statistics.median(
                100 * r["machine"]["other_cpu_s"] / r["machine"]["wall"] for r in rs)
            med[s][str(n)]["cpu_s_per_gib"] = {
                g: statistics.median(r["cpu_s"][g] / (n * size / (1 << 30)) for r in rs) for g in groups}
            med[s][str(n)]["steal_frac"] = statistics.median(r["machine"]["steal_frac"] for r in rs)
            med[s][str(n)]["busy_frac"] = statistics.median(r["machine"]["busy_frac"] for r in rs)

    print(f"\nFigure 4 on loopback: {size / MiB:.0f} MiB file, {a.servers} morris servers, libnfs readers "
          f"({chunk // 1024} KiB READs, depth {a.depth}), median of {a.runs} runs, MiB/s")
    print(f"{'N':>2} {'morris/client':>14} {'morris agg':>11} {'ganesha/client':>15} {'ganesha agg':>12}"
          f" {'req/READ':>9}")
    for n in ns:
        m, g = med["morris"][str(n)], med["ganesha"][str(n)]
        print(f"{n:>2} {m['per_client_mean']:>14.0f} {m['aggregate']:>11.0f} {g['per_client_mean']:>15.0f}"
              f" {g['aggregate']:>12.0f} {m['requests_per_nfs_read']:>9.2f}")
    m1, m4 = med["morris"]["1"], med["morris"][str(ns[-1])]
    g1, g4 = med["ganesha"]["1"], med["ganesha"][str(ns[-1])]
    print(f"\nper-client at N={ns[-1]} / N=1: morris {m4['per_client_mean'] / m1['per_client_mean']:.2f}, "
          f"ganesha {g4['per_client_mean'] / g1['per_client_mean']:.2f}")
    print(f"aggregate at N={ns[-1]} / N=1:  morris {m4['aggregate'] / m1['aggregate']:.2f}, "
          f"ganesha {g4['aggregate'] / g1['aggregate']:.2f}")
    print("\nCPU during the reads, % of one core (median; 200% = both cores):")
    for s in ("morris", "ganesha"):
        for n in ns:
            c = med[s][str(n)]["cpu_pct_of_wall"]
            print(f"  {s:<8} N={n}: " + ", ".join(f"{g} {v:.0f}%" for g, v in c.items())
                  + f"  (steal {100 * med[s][str(n)]['steal_frac']:.0f}% of all CPU time)")
    print("\nCPU seconds per GiB delivered to the readers (median), i.e. the cost of the data path:")
    for s in ("morris", "ganesha"):
        for n in ns:
            c = med[s][str(n)]["cpu_s_per_gib"]
            print(f"  {s:<8} N={n}: total {sum(c.values()):.2f} = " + " + ".join(f"{g} {v:.2f}" for g, v in c.items()))
    last = runs["morris"][str(ns[-1])][-1]
    print(f"\nmorris server requests during the last N={ns[-1]} read: {json.dumps(last['server_requests'])} "
          f"for {last['nfs_reads']} NFS READs; by server {json.dumps(last['server_requests_by_server'])}")

    res = {"date": time.strftime("%Y-%m-%d"), "args": vars(a), "size_mib": size / MiB, "clients": ns,
           "cmd": " ".join([os.path.relpath(sys.argv[0], ROOT) if sys.argv[0].startswith(ROOT) else sys.argv[0]]
                           + sys.argv[1:]),
           "write_mib_s": write_rate, "background_before": bg, "median": med, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.out}")
    plot(res, a.png)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"interrupted ({e}); cleaned up")
