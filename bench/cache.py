#!/usr/bin/env python3
"""Cache mode (issue 14, "Done when"): a morris directory bound to an NFS home, measured against
reading and listing home directly, on the emulated cluster (bench/cluster).

    python3 bench/cache.py [--size 500M] [--runs 3] [--servers 1,2,4]
                           [--entries 100,1000,10000,100000] [--parts abc | --no-delay]
                           [--delay-ms 15] [--nfs-depth 16] [--server-rate 200mbit]
                           [--home-rate 800mbit] [--client-rate 800mbit]   (all options: --help)

Topology (network namespaces + tbf on veths, as bench/cluster; prefix cb-, subnet 10.83.0):
  cb-h0  home: nfs-ganesha (bench/lib/ganesha.py, FSAL VFS, Attr_Expiration_Time = 0) exporting
         a local directory: `big` (--size bytes of seeded pseudo-random data) and ls/dN (N empty
         files, for each N of --entries); link --home-rate (800 Mbit/s: 4x a stripe server's).
  cb-h1  the client: FUSE mounts of the morris volumes, the libnfs readers; link --client-rate.
  cb-h2.. one morris stripe server each (`morris server`), link --server-rate (200 Mbit/s).
  Volumes: one per k in --servers, on the first k server hosts (port 7700 + k), all up at once
  (so the configurations can be interleaved), formatted with `morris format --servers ...`.
  Each volume holds `plain/big`, a copy of home's file written through the mount (an uncached
  morris file). The morris binary is $MORRIS_EXE (default /work/bin/morris).

(a) Read throughput, `big` read whole once per configuration and run (1 MiB read(2)s through
    the FUSE mount in the client host; libnfs bench/lib/nfsread.c with --nfs-depth 1 MiB READs in
    flight for home direct):
      direct  home read by libnfs from the client host;
      plain   plain/big of the k-server volume;
      miss    DIR/big where DIR is an empty directory bound (`morris cache bind DIR URL`, run in
              the client host) just before, a fresh binding per run: nothing of it is cached, the
              k servers fetch from home the stripe units they store while the client reads;
      hit     the same file read again (fresh mount; every page cache dropped, so it comes from
              the servers' disks, as plain does).
    Before every read every page cache is dropped (`sync; echo 3 > drop_caches`; the hosts share
    one kernel, so this empties the client's, the servers' and home's caches) and a fresh morris
    mount is made; then, for the readings of home (direct, miss), home's file is read locally
    once (home's page cache warm: the disk is not what is measured; --cold-home skips that).
    After each miss: `morris cache status --server ... --json`; the fetched_bytes added over all
    servers must equal the file size (each byte fetched from home once) -- reported per run, and
    home's own link counter (bytes out of cb-h0) beside it. After each hit the run's copy is freed
    with `morris cache evict` (disk space). After all runs the file is read once more through a
    new binding (miss) and again (hit), both checksummed (SHA-256) against home's file, untimed.
    Also per k and run, "duplex TCP": the miss's traffic without morris -- k bulk TCP streams
    home -> server and k server -> client at once (each server link full in both directions),
    4 s each; the MiB/s the server -> client streams deliver is printed beside the miss. With
    plain tbf FIFO queues a link full both ways starves one direction's ACK clock (the ACKs of
    home -> server wait behind 50 ms of server -> client data: server -> client at 13-90 Mbit/s
    of 191 in some runs), which a real NIC's short queue does not do; so by default every link
    gets htb with pure ACKs (packets under 128 bytes) in a class of their own ahead of the data
    (bench/cluster/hosts.py Cluster(ack_prio=True); this kernel has no prio or fq_codel qdisc),
    and the column shows 191 both ways. --no-ack-prio gives the plain FIFOs back
    (--tbf-latency-ms sets the queue; 50 is bench/cluster's).
    Goals: miss >= 0.95 x min(direct, k x server link goodput); hit >= 0.95 x plain.
    (Panache, Table 1: 1.456 vs 1.776 Gb/s direct with 2 gateway nodes, 1.952 vs 2.552 with 3:
    a miss at 0.76-0.82x direct.)

(b) Listing: a directory of N home entries, on the largest volume (--list-servers):
      direct  bench/lib/nfslist.c: libnfs nfs_opendir + nfs_readdir of home's ls/dN (LOOKUP,
              READDIRPLUS until EOF), timed after the mount, from the client host; `nfs-ls`'s
              wall time (process start, portmapper, MOUNT and printing included) is recorded
              beside it as a cross-check;
      miss    os.listdir(DIR/dN) in the client host, DIR bound to home's ls/ just before (fresh
              binding per run: dN is not even looked up yet), on a fresh mount;
      hit     the same listing again on a fresh mount (the names come from the servers, not
              the client); "hit same mount", the listing repeated at once in the miss's mount
              (what the client keeps itself), is recorded beside it.
    Each figure is timed inside one process around the listing alone. Home is warm for direct
    and miss alike: right before each of them home's directory is listed once, untimed (ganesha
    keeps directory entries in a cache of its own, which drop_caches does not empty and 100,000
    entries overflow; without this whoever listed a directory second would find it warm). The
    page caches are not dropped (the morris mount is fresh for miss and hit, so the client holds
    nothing); --list-cold drops every page cache before each listing instead of warming home.
    Goals: miss <= 1.25x direct, hit <= 0.2x direct. (Panache, Table 2, 100/1,000/10,000/100,000
    entries: miss 0.77, 1.26, 2.825, 25.45 s (orphan inodes); hit 0.032, 0.097, 0.15, 1.212 s.)

(c) The (a) reads of home (direct, miss; and hit) with 30 ms added to every round trip to home:
    bench/lib/delay_relay.py runs inside cb-h0 (as bench/home.py runs it) and relays h0:12049 ->
    2049 (NFS) and h0:30048 -> 20048 (MOUNT), holding every chunk --delay-ms (15) in each
    direction. The morris bindings of (c) name the relay's ports in their URL, the libnfs reader
    reads through the same relay. THIS IS A DELAYING TCP RELAY, NOT NETEM: each TCP connection is
    split in two short-RTT connections, so TCP's slow start and congestion window never see the
    30 ms; what is emulated is the extra 30 ms every request/response exchange with home waits
    (see the relay's docstring). Goal: miss >= 0.9 x min(direct through the relay, k x server link
    goodput).

Every configuration runs once per repetition, the order rotated each repetition (all parts
interleaved); figures are medians of --runs. The link shaping is checked before and after
(bench/cluster's check; a failure refuses the run). Prints a table, writes bench/results-cache.json
(date, exact command, git commit, morris binary, raw per-run figures incl. machine CPU use and
per-link bytes, the cache status counters, the servers' WARN/ERROR log lines) and docs/cache.png
(if matplotlib is installed). Everything (mounts, processes, namespaces) is removed on exit.
Needs root, iproute2, fuse3, nfs-ganesha(-vfs), rpcbind, libnfs-dev, libnfs-utils, gcc.

Duration with the defaults: about 25-30 min (3 runs; the k = 1 reads at 23 MiB/s dominate; setup,
the link checks and the final data check add ~5 min).
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
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from cluster.hosts import (PAYLOAD_EFF, Cluster, ShapingError, parse_rate,  # noqa: E402
                           require_root_and_tools)
from cluster.systems import (MORRIS, MiB, Morris, build_nfsread, cluster_keys, cold,  # noqa: E402
                             concurrent_reads, fuse_reader, nfs_reader, write_file)
from home import RELAY_MOUNT, RELAY_NFS, measure_rtt, start_relay, stop_proc  # noqa: E402
from lib.ganesha import Ganesha  # noqa: E402
from lib.util import log_warnings, parse_size  # noqa: E402

NFS_PORT, MOUNT_PORT = 2049, 20048
# Panache (FAST '10) Table 2, seconds: entries -> (miss with orphan inodes, hit).
PANACHE_LS = {100: (0.77, 0.032), 1000: (1.26, 0.097), 10000: (2.825, 0.15), 100000: (25.45, 1.212)}

# A timed listing, run inside the client host: entries and seconds of os.listdir(path).
_LISTDIR = r"""
import json, os, sys, time
t = time.perf_counter(); n = len(os.listdir(sys.argv[1])); dt = time.perf_counter() - t
print(json.dumps({"entries": n, "secs": dt}))
"""

# nfs-ls run whole (wall time of the process), its entries counted; inside the client host.
_NFSLS = r"""
import json, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(["nfs-ls", sys.argv[1]], capture_output=True, text=True)
dt = time.perf_counter() - t
names = [l.split()[-1] for l in p.stdout.splitlines() if l.split()]
print(json.dumps({"rc": p.returncode, "entries": sum(1 for x in names if x not in (".", "..")),
                  "secs": dt, "err": p.stderr.strip()[-300:]}))
"""

_SHA = r"""
import hashlib, sys
h = hashlib.sha256(); n = 0
with open(sys.argv[1], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b); n += len(b)
print(h.hexdigest(), n)
"""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def git(*args):
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    return r.stdout.strip()


def goodput_mib(rate_bps):
    """Payload MiB/s one TCP stream gets through a link shaped to rate_bps."""
    return rate_bps * PAYLOAD_EFF / 8 / MiB


def binary_id(exe):
    try:
        h = hashlib.sha256()
        with open(exe, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        return {"path": exe, "sha256": h.hexdigest()[:16],
                "mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(exe)))}
    except OSError as e:
        return {"path": exe, "error": str(e)}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def build_nfslist(outdir):
    out = os.path.join(outdir, "nfslist")
    r = subprocess.run(["gcc", "-O2", "-o", out, os.path.join(BENCH, "lib", "nfslist.c"), "-lnfs"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building nfslist failed: {r.stderr}")
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def ns_cpu(hosts):
    """{"NS/comm[pid]": user+system CPU seconds so far} of every process in the hosts."""
    tck = os.sysconf("SC_CLK_TCK")
    out = {}
    for h in hosts:
        for pid in h.pids():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    head, tail = f.read().rsplit(")", 1)
                v = tail.split()
                out[f"{h.ns}/{head.split('(', 1)[1]}[{pid}]"] = (int(v[11]) + int(v[12])) / tck
            except (OSError, IndexError, ValueError):
                pass
    return out


# ------------------------------------------------------------------------------------ the bench
class Bench:
    """The cluster, home, the volumes and the client, and the operations the experiments use."""

    def __init__(self, cl, a):
        self.cl, self.a = cl, a
        self.home, self.client = cl.hosts[0], cl.hosts[1]
        self.servers = cl.hosts[2:]
        self.vols = {}  # k -> Morris
        self.export = os.path.join(self.home.dir, "export")
        self.ganesha = None
        self.relay = None
        self.nfsread = self.nfslist = None
        self.home_sum = None

    # -------------------------------------------------------------- setup
    def setup_home(self):
        a = self.a
        os.makedirs(os.path.join(self.export, "ls"))
        log(f"writing {a.size / MiB:.0f} MiB at home")
        write_file(os.path.join(self.export, "big"), a.size, seed=a.seed)
        self.home_sum = sha256_file(os.path.join(self.export, "big"))
        for n in (a.entries if "b" in a.parts else []):
            d = os.path.join(self.export, "ls", f"d{n}")
            os.makedirs(d)
            t = time.perf_counter()
            for i in range(n):
                os.close(os.open(os.path.join(d, f"file{i:07d}"), os.O_CREAT | os.O_WRONLY, 0o644))
            log(f"home: {d} with {n} files ({time.perf_counter() - t:.1f} s)")
        subprocess.run(["sync"], check=True)
        self.nfsread = build_nfsread(self.cl.workdir)
        self.nfslist = build_nfslist(self.cl.workdir)
        self.ganesha = Ganesha(self.export, os.path.join(self.home.dir, "ganesha"), netns=self.home.ns,
                               bind_addr=self.home.addr, port=NFS_PORT, attr_expiration=0)
        self.ganesha.start()
        if self.ganesha.mount_port != MOUNT_PORT:
            raise RuntimeError(f"ganesha MOUNT port {self.ganesha.mount_port}, expected {MOUNT_PORT}")

    def start_relay(self):
        self.relay = start_relay(self.home, self.a.delay_ms)

    def stop(self):
        if self.relay is not None:
            stop_proc(self.relay)
            self.relay = None
        for mo in self.vols.values():
            mo.stop()
        if self.ganesha is not None:
            self.ganesha.stop()

    def setup_volumes(self):
        a = self.a
        for k in a.servers:
            mo = Morris(self.cl, self.servers[:k], port=7700 + k,
                        mount_args=["--readahead", a.morris_readahead] if a.morris_readahead else [])
            self.vols[k] = mo
            m = self.mount(k)
            os.mkdir(os.path.join(m, "plain"))
            log(f"writing plain/big ({a.size / MiB:.0f} MiB) into the {k}-server volume")
            write_file(os.path.join(m, "plain", "big"), a.size, seed=a.seed)
            self.umount(k)

    # -------------------------------------------------------------- helpers
    def url(self, sub="", relay=False):
        """libnfs-style URL of home's export (or a directory below it), direct or via the relay."""
        np, mp = (RELAY_NFS, RELAY_MOUNT) if relay else (NFS_PORT, MOUNT_PORT)
        path = "/export" + ("/" + sub.strip("/") if sub else "")
        return f"nfs://{self.home.addr}{path}?version=3&nfsport={np}&mountport={mp}"

    def mount(self, k):
        return self.vols[k].mount(self.client, name=f"m{k}")

    def umount(self, k):
        self.vols[k].umount(self.client)

    def morris(self, *args, timeout=600):
        """`morris ARGS` in the client host (bind/evict find the mount in mountinfo there), with
        the volume key (the same key files serve every volume of the cluster) after ARGS[0]."""
        return self.client.run([MORRIS, args[0], "--key", cluster_keys(self.cl).volume, *args[1:]],
                               timeout=timeout).stdout

    def bind(self, k, name, url):
        """A fresh directory NAME at the root of volume k, bound to url; returns nothing (the
        volume is unmounted again)."""
        m = self.mount(k)
        try:
            d = os.path.join(m, name)
            os.mkdir(d)
            out = self.morris("cache", "bind", d, url)
            log(f"  {out.strip()}")
        finally:
            self.umount(k)

    def status(self, k):
        """`morris cache status --json` of volume k: {(server, binding): counters}, raw list."""
        raw = json.loads(self.morris("cache", "status", "--server", self.vols[k].addrs[0], "--json"))
        flat = {}
        for s in raw:
            if "error" in s:
                raise RuntimeError(f"cache status: server {s['server']}: {s['error']}")
            for b in s.get("bindings", []):
                flat[(s["server"], b["binding"], b["url"])] = b
        return flat, raw

    @staticmethod
    def status_diff(before, after):
        """Counters added between two status() snapshots, summed over servers and bindings;
        plus per server."""
        keys = ("hits", "misses", "fetched_bytes", "fetch_ms", "meta_requests", "evictions")
        tot = {x: 0 for x in keys}
        per_server = {}
        for key, b in after.items():
            b0 = before.get(key, {})
            ps = per_server.setdefault(str(key[0]), {x: 0 for x in keys})
            for x in keys:
                d = b[x] - b0.get(x, 0)
                tot[x] += d
                ps[x] += d
        cached = {}
        for (srv, _, _), b in after.items():
            cached[str(srv)] = b["cached_bytes"]  # per server, all bindings
        unreachable = sorted({f"{key[0]}: {b.get('last_error')}" for key, b in after.items() if not b["reachable"]})
        return {**tot, "per_server": per_server, "cached_bytes_per_server": cached, "unreachable": unreachable}

    def warm_home(self):
        """Home's file in home's page cache (read locally once), unless --cold-home."""
        if self.a.cold_home:
            return
        with open(os.path.join(self.export, "big"), "rb") as f:
            while f.read(4 * MiB):
                pass

    def read(self, job):
        """One timed read (cold caches already arranged by the caller); with the CPU seconds
        each long-lived process of the cluster (servers, mount daemon, ganesha, relay) used."""
        c0 = ns_cpu(self.cl.hosts)
        r = concurrent_reads([job], expect_size=self.a.size)
        c1 = ns_cpu(self.cl.hosts)
        out = {"mib_s": r["aggregate"], "secs": r["wall_s"], "cpu_busy": r["cpu"]["busy"],
               "cpu_s": {k: round(v - c0.get(k, 0.0), 2) for k, v in c1.items() if v - c0.get(k, 0.0) >= 0.01},
               "links_MiB": {ns: {k: round(v, 1) for k, v in x.items()} for ns, x in r["links"].items()},
               "link_series": r["link_series"]}
        return out

    def fuse_read(self, k, path_in_vol, home_read):
        cold()
        if home_read:
            self.warm_home()
        m = self.mount(k)
        try:
            return self.read(fuse_reader(self.client, os.path.join(m, path_in_vol)))
        finally:
            self.umount(k)

    def direct_read(self, relay):
        cold()
        self.warm_home()
        url = self.url("big", relay)
        return self.read(nfs_reader(self.client, url, self.nfsread, self.a.nfs_depth))

    def host_json(self, host, argv, timeout=3600):
        r = host.run(argv, timeout=timeout)
        return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ (a), (c)
def run_duplex(b, rep, k, dur=4.0, warm=1.0):
    """The miss's traffic as plain TCP: at once, one bulk stream home -> each of the k servers and
    one each server -> client (every server link full in both directions, as in a miss). Their
    goodputs are what the emulated network itself gives that pattern; the miss is compared to the
    sum of the server -> client streams too."""
    srv = b.servers[:k]
    pairs = [(b.home, h) for h in srv] + [(h, b.client) for h in srv]
    got = b.cl._stream(pairs, dur, warm)
    ingest, serve = got[:k], got[k:]
    r = {"home_to_server_mbit": [round(g / 1e6, 1) for g in ingest],
         "server_to_client_mbit": [round(g / 1e6, 1) for g in serve],
         "to_client_mib_s": sum(serve) / 8 / MiB}
    log(f"run {rep + 1} duplex TCP k={k}: home->servers {r['home_to_server_mbit']} Mbit/s, servers->client "
        f"{r['server_to_client_mbit']} Mbit/s (into the client {r['to_client_mib_s']:.1f} MiB/s)")
    return r


def machine_jiffies():
    """(busy, total) jiffies of every CPU so far, from /proc/stat (the whole machine: every host)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return sum(v) - idle, sum(v)


def timed_cpu(hosts, fn):
    """fn()'s result with, added, the machine's CPU busy share while it ran ("cpu_busy", of all
    CPUs) and the CPU seconds each program of the hosts used meanwhile ("cpu_s")."""
    c0, j0 = ns_cpu(hosts), machine_jiffies()
    out = fn()
    c1, j1 = ns_cpu(hosts), machine_jiffies()
    out["cpu_busy"] = round((j1[0] - j0[0]) / max(1, j1[1] - j0[1]), 3)
    out["cpu_s"] = {k: round(v - c0.get(k, 0.0), 3) for k, v in c1.items() if v - c0.get(k, 0.0) >= 0.005}
    return out


def cpu_brief(r):
    """'cb-h2/morris 1.2, cb-h1/morris 0.8, ...': CPU seconds of a read by host and program."""
    agg = {}
    for key, v in r.get("cpu_s", {}).items():
        who = key.split("[")[0]  # NS/comm (comm: first 15 characters of the program's name)
        agg[who] = agg.get(who, 0.0) + v
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(agg.items(), key=lambda x: -x[1]))


def run_direct(b, rep, relay):
    """Home read by libnfs from the client host (through the relay if relay)."""
    r = b.direct_read(relay)
    log(f"run {rep + 1} direct{'+relay' if relay else ''}: {r['mib_s']:.1f} MiB/s "
        f"({r['secs']:.1f} s, CPU {r['cpu_busy']:.0%}; CPU s: {cpu_brief(r)})")
    return r


def run_plain(b, rep, k):
    r = b.fuse_read(k, "plain/big", home_read=False)
    log(f"run {rep + 1} plain k={k}: {r['mib_s']:.1f} MiB/s ({r['secs']:.1f} s, CPU {r['cpu_busy']:.0%}; "
        f"CPU s: {cpu_brief(r)})")
    return r


def run_cache_pair(b, rep, k, relay, name=None):
    """A fresh binding, its miss and its hit read, the status counters of each, then evict.
    Returns {"miss": ..., "hit": ..., "evict": ...}."""
    size = b.a.size
    name = name or f"c{'r' if relay else ''}{rep}"
    b.bind(k, name, b.url("", relay))
    s0, _ = b.status(k)
    miss = b.fuse_read(k, f"{name}/big", home_read=True)
    s1, _ = b.status(k)
    miss["status"] = b.status_diff(s0, s1)
    miss["fetched_eq_size"] = miss["status"]["fetched_bytes"] == size
    miss["home_tx_MiB"] = miss["links_MiB"][b.home.ns]["tx_MiB"]
    hit = b.fuse_read(k, f"{name}/big", home_read=False)
    s2, _ = b.status(k)
    hit["status"] = b.status_diff(s1, s2)
    hit["home_tx_MiB"] = hit["links_MiB"][b.home.ns]["tx_MiB"]
    tag = f"k={k}{' +relay' if relay else ''}"
    st = miss["status"]
    log(f"run {rep + 1} miss {tag}: {miss['mib_s']:.1f} MiB/s ({miss['secs']:.1f} s, CPU {miss['cpu_busy']:.0%}); "
        f"fetched {st['fetched_bytes']} B of {size} ({'= size' if miss['fetched_eq_size'] else 'NOT the size'}), "
        f"unit misses {st['misses']}, home sent {miss['home_tx_MiB']:.0f} MiB; CPU s: {cpu_brief(miss)}")
    log(f"run {rep + 1} hit  {tag}: {hit['mib_s']:.1f} MiB/s ({hit['secs']:.1f} s, CPU {hit['cpu_busy']:.0%}); "
        f"unit hits {hit['status']['hits']}, fetched {hit['status']['fetched_bytes']} B; CPU s: {cpu_brief(hit)}")
    m = b.mount(k)
    try:
        ev = b.morris("cache", "evict", os.path.join(m, name, "big")).strip()
    finally:
        b.umount(k)
    s3, _ = b.status(k)
    cached_after = b.status_diff(s2, s3)["cached_bytes_per_server"]
    return {"miss": miss, "hit": hit, "evict": ev, "cached_bytes_after_evict": cached_after}


def verify_data(b, k):
    """Untimed: read the file through a new binding (miss) and again (hit), SHA-256 of both
    against home's file; fetched_bytes of the miss."""
    name = "verify"
    b.bind(k, name, b.url())
    s0, _ = b.status(k)
    out = {}
    for what in ("miss", "hit"):
        cold()
        m = b.mount(k)
        try:
            h, n = b.client.run(["python3", "-c", _SHA, os.path.join(m, name, "big")], timeout=3600).stdout.split()
        finally:
            b.umount(k)
        out[what] = {"sha256": h, "bytes": int(n), "ok": h == b.home_sum and int(n) == b.a.size}
        if what == "miss":
            s1, _ = b.status(k)
            out["miss"]["fetched_bytes"] = b.status_diff(s0, s1)["fetched_bytes"]
    log(f"data check k={k}: miss {'ok' if out['miss']['ok'] else 'MISMATCH'}, hit {'ok' if out['hit']['ok'] else 'MISMATCH'}"
        f" (home {b.home_sum[:16]}, read {out['miss']['sha256'][:16]} / {out['hit']['sha256'][:16]})")
    return out


# ------------------------------------------------------------------------------------ (b)
def run_listing(b, rep, n, k, bound_name):
    """Home's ls/dN listed directly (nfslist, and nfs-ls as a cross-check), then through the
    fresh binding bound_name (-> home's ls/) of volume k: miss, then hit."""
    out = {}
    nfslist = [b.nfslist, b.url("", b.a.list_relay), f"/ls/d{n}"]

    def prep(home_read):
        # --list-cold: every page cache dropped. Otherwise, before a listing that reads home, home
        # lists the directory once untimed: ganesha keeps directory entries in a cache of its own
        # (drop_caches does not empty it, and 100,000 entries overflow it), so whoever listed last
        # would otherwise find it warm and the one after a bigger directory cold.
        if b.a.list_cold:
            cold()
        elif home_read:
            b.host_json(b.client, nfslist)

    prep(True)
    out["direct"] = timed_cpu(b.cl.hosts, lambda: b.host_json(b.client, nfslist))
    if not b.a.no_nfs_ls:
        prep(True)
        out["nfs_ls"] = b.host_json(b.client, ["python3", "-c", _NFSLS, b.url(f"ls/d{n}", b.a.list_relay)])
    for what in ("miss", "hit"):
        s0, _ = b.status(k)
        prep(what == "miss")
        m = b.mount(k)
        try:
            argv = ["python3", "-c", _LISTDIR, os.path.join(m, bound_name, f"d{n}")]
            out[what] = timed_cpu(b.cl.hosts, lambda: b.host_json(b.client, argv))
            if what == "miss":
                # Again at once in the same mount: what the client itself keeps (leases, names).
                out["hit_same_mount"] = b.host_json(b.client, argv)
        finally:
            b.umount(k)
        s1, _ = b.status(k)
        st = b.status_diff(s0, s1)
        out[what]["home_meta_requests"] = st["meta_requests"]
        out[what]["home_unreachable"] = st["unreachable"]
    for what in ("direct", "miss", "hit", "hit_same_mount"):
        if out[what]["entries"] != n:
            raise RuntimeError(f"listing d{n} {what}: {out[what]['entries']} entries, expected {n}")
    ls = out.get("nfs_ls")
    log(f"run {rep + 1} list {n:>6}: direct {out['direct']['secs']:.3f} s, miss {out['miss']['secs']:.3f} s, "
        f"hit {out['hit']['secs']:.3f} s (same mount {out['hit_same_mount']['secs']:.3f} s)"
        + (f", nfs-ls wall {ls['secs']:.3f} s ({ls['entries']} entries{', rc ' + str(ls['rc']) if ls['rc'] else ''})"
           if ls else "")
        + f"; requests to home: miss {out['miss']['home_meta_requests']}, hit {out['hit']['home_meta_requests']}"
        + f"; machine CPU busy: direct {out['direct']['cpu_busy']:.0%}, miss {out['miss']['cpu_busy']:.0%}"
        + f" (miss CPU s: {cpu_brief(out['miss'])})")
    return out


# ------------------------------------------------------------------------------------ summary
def summarize(res, a, srv_goodput):
    """Medians, ratios and goals from the raw figures."""
    raw = res["raw"]
    s = {"reads": {}, "relay": {}, "listing": {}}
    goals = {}
    if "a" in a.parts:
        direct = med([r["mib_s"] for r in raw["direct"]])
        s["reads"]["direct"] = direct
        for k in a.servers:
            plain = med([r["mib_s"] for r in raw["plain"][str(k)]])
            pairs = raw["cache"][str(k)]
            miss = med([p["miss"]["mib_s"] for p in pairs])
            hit = med([p["hit"]["mib_s"] for p in pairs])
            bound = min(direct, k * srv_goodput)
            dx = [d["to_client_mib_s"] for d in raw["duplex"][str(k)]]
            row = {"plain": plain, "miss": miss, "hit": hit, "bound": bound, "miss_over_bound": ratio(miss, bound),
                   "duplex_tcp": med(dx), "duplex_tcp_min": min(dx) if dx else None,
                   "duplex_tcp_max": max(dx) if dx else None,
                   "miss_over_direct": ratio(miss, direct), "hit_over_plain": ratio(hit, plain),
                   "fetched_eq_size_runs": f"{sum(p['miss']['fetched_eq_size'] for p in pairs)}/{len(pairs)}",
                   "fetched_bytes": [p["miss"]["status"]["fetched_bytes"] for p in pairs],
                   "hit_fetched_bytes": [p["hit"]["status"]["fetched_bytes"] for p in pairs]}
            s["reads"][str(k)] = row
            goals[f"(a) k={k} miss >= 0.95 x min(direct, k x server goodput)"] = (row["miss_over_bound"] or 0) >= 0.95
            goals[f"(a) k={k} hit >= 0.95 x plain"] = (row["hit_over_plain"] or 0) >= 0.95
            goals[f"(a) k={k} fetched_bytes == size after every miss"] = all(p["miss"]["fetched_eq_size"] for p in pairs)
    if "c" in a.parts:
        direct = med([r["mib_s"] for r in raw["direct_relay"]])
        s["relay"]["direct"] = direct
        for k in a.servers:
            pairs = raw["cache_relay"][str(k)]
            miss = med([p["miss"]["mib_s"] for p in pairs])
            hit = med([p["hit"]["mib_s"] for p in pairs])
            bound = min(direct, k * srv_goodput)
            row = {"miss": miss, "hit": hit, "bound": bound, "miss_over_bound": ratio(miss, bound),
                   "miss_over_direct": ratio(miss, direct),
                   "fetched_eq_size_runs": f"{sum(p['miss']['fetched_eq_size'] for p in pairs)}/{len(pairs)}"}
            s["relay"][str(k)] = row
            goals[f"(c) k={k} miss >= 0.9 x min(direct via relay, k x server goodput)"] = (row["miss_over_bound"] or 0) >= 0.9
    if "b" in a.parts:
        for n in a.entries:
            rs = raw["listing"][str(n)]
            d = med([r["direct"]["secs"] for r in rs])
            miss = med([r["miss"]["secs"] for r in rs])
            hit = med([r["hit"]["secs"] for r in rs])
            hit_same = med([r["hit_same_mount"]["secs"] for r in rs])
            ls = med([r["nfs_ls"]["secs"] for r in rs if "nfs_ls" in r and r["nfs_ls"]["rc"] == 0])
            row = {"direct": d, "nfs_ls_wall": ls, "miss": miss, "hit": hit, "hit_same_mount": hit_same,
                   "miss_over_direct": ratio(miss, d),
                   "hit_over_direct": ratio(hit, d),
                   "home_meta_requests_miss": [r["miss"]["home_meta_requests"] for r in rs],
                   "home_meta_requests_hit": [r["hit"]["home_meta_requests"] for r in rs],
                   "panache_miss": PANACHE_LS.get(n, (None, None))[0], "panache_hit": PANACHE_LS.get(n, (None, None))[1]}
            s["listing"][str(n)] = row
            goals[f"(b) {n} entries miss <= 1.25 x direct"] = (row["miss_over_direct"] or 1e9) <= 1.25
            goals[f"(b) {n} entries hit <= 0.2 x direct"] = (row["hit_over_direct"] or 1e9) <= 0.2
    return s, goals


def fmt(x, spec=".1f", none="-"):
    return none if x is None else format(x, spec)


def table(res, a, srv_goodput, home_goodput):
    s, goals = res["summary"], res["goals"]
    L = [f"cache mode on {len(a.servers) and max(a.servers) + 2} emulated hosts: home {a.home_rate}, client "
         f"{a.client_rate}, each server {a.server_rate} (TCP goodput: server {srv_goodput:.1f} MiB/s, home "
         f"{home_goodput:.1f} MiB/s); medians of {a.runs} runs; {res['date']}, commit {res['commit']}"
         f"{' (dirty tree)' if res['dirty'] else ''}"]
    if "a" in a.parts:
        L += ["", f"(a) reading a {a.size / MiB:.0f} MiB file, MiB/s (direct: libnfs, {a.nfs_depth} x 1 MiB READs in "
                  f"flight; bound = min(direct, k x server goodput))",
              f"{'k':>3}{'direct':>9}{'plain':>9}{'miss':>9}{'hit':>9}{'bound':>9}{'miss/bound':>12}{'miss/direct':>13}"
              f"{'hit/plain':>11}{'fetched=size':>14}{'duplex TCP (min-max)':>24}"]
        for k in a.servers:
            r = s["reads"][str(k)]
            L.append(f"{k:>3}{fmt(s['reads']['direct']):>9}{fmt(r['plain']):>9}{fmt(r['miss']):>9}{fmt(r['hit']):>9}"
                     f"{fmt(r['bound']):>9}{fmt(r['miss_over_bound'], '.2f'):>12}{fmt(r['miss_over_direct'], '.2f'):>13}"
                     f"{fmt(r['hit_over_plain'], '.2f'):>11}{r['fetched_eq_size_runs']:>14}"
                     f"{fmt(r['duplex_tcp']) + (' (' + fmt(r['duplex_tcp_min']) + '-' + fmt(r['duplex_tcp_max']) + ')' if r['duplex_tcp'] is not None else ''):>24}")
        L.append("    goals: miss/bound >= 0.95 (Panache: 0.76-0.82 x direct), hit/plain >= 0.95; fetched=size: runs "
                 "whose miss fetched exactly the file size from home (sum over servers, `morris cache status`)")
        L.append("    duplex TCP: MiB/s into the client of k bulk TCP streams server -> client while k more run "
                 "home -> server (the miss's traffic as plain TCP, no morris; median and range over runs). Well "
                 "below the bound, it means a server link full both ways starved one direction's ACKs in the "
                 "tbf FIFOs in that run: an emulation limit the miss may meet as well")
    if "b" in a.parts:
        L += ["", f"(b) listing N home entries, seconds (volume of {a.list_servers} servers; direct: libnfs "
                  f"opendir/readdir after the mount; nfs-ls: whole process"
                  f"{'; home through the relay, +' + format(2 * a.delay_ms, '.0f') + ' ms per round trip' if a.list_relay else ''})",
              f"{'entries':>8}{'direct':>9}{'nfs-ls':>9}{'miss':>9}{'hit':>9}{'miss/dir':>10}{'hit/dir':>9}"
              f"{'hit same mnt':>14}{'Panache miss':>14}{'hit':>7}"]
        for n in a.entries:
            r = s["listing"][str(n)]
            L.append(f"{n:>8}{fmt(r['direct'], '.3f'):>9}{fmt(r['nfs_ls_wall'], '.3f'):>9}{fmt(r['miss'], '.3f'):>9}"
                     f"{fmt(r['hit'], '.3f'):>9}{fmt(r['miss_over_direct'], '.2f'):>10}{fmt(r['hit_over_direct'], '.2f'):>9}"
                     f"{fmt(r['hit_same_mount'], '.3f'):>14}{fmt(r['panache_miss'], '.3f'):>14}{fmt(r['panache_hit'], '.3f'):>7}")
        L.append("    goals: miss/direct <= 1.25, hit/direct <= 0.2 (hit: a fresh mount, names from the servers; "
                 "hit same mnt: listed again at once in the miss's mount, informational)")
    if "c" in a.parts:
        rtt = res.get("rtt", {})
        L += ["", f"(c) the reads with +{2 * a.delay_ms:g} ms per round trip to home, MiB/s -- a DELAYING TCP RELAY "
                  f"(bench/lib/delay_relay.py in the home host), NOT netem: TCP's own RTT stays short"
              + (f"; NFS NULL RTT direct {rtt['direct']['median_ms']:.2f} ms, via relay "
                 f"{rtt['relay']['median_ms']:.2f} ms" if "relay" in rtt else ""),
              f"{'k':>3}{'direct':>9}{'miss':>9}{'hit':>9}{'bound':>9}{'miss/bound':>12}{'miss/direct':>13}"
              f"{'fetched=size':>14}"]
        for k in a.servers:
            r = s["relay"][str(k)]
            L.append(f"{k:>3}{fmt(s['relay']['direct']):>9}{fmt(r['miss']):>9}{fmt(r['hit']):>9}{fmt(r['bound']):>9}"
                     f"{fmt(r['miss_over_bound'], '.2f'):>12}{fmt(r['miss_over_direct'], '.2f'):>13}"
                     f"{r['fetched_eq_size_runs']:>14}")
        L.append("    goal: miss/bound >= 0.9 (bound = min(direct via the same relay, k x server goodput))")
    if res.get("data_check"):
        L += ["", "data check (SHA-256 of the file read through a new binding, miss and hit, vs home's): "
              + ", ".join(f"k={k} {'ok' if v['miss']['ok'] and v['hit']['ok'] else 'MISMATCH'}"
                          for k, v in res["data_check"].items())]
    L += ["", "goals: " + "; ".join(f"{g}: {'met' if ok else 'MISSED'}" for g, ok in goals.items())]
    return L


def plot(res, a, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no PNG")
        return
    s = res["summary"]
    panels = [p for p in "abc" if p in a.parts]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    for ax, p in zip(axes[0], panels):
        if p in "ac":
            part = s["reads"] if p == "a" else s["relay"]
            series = [("direct", "#999999", "home direct (libnfs)" + (" via relay" if p == "c" else ""))]
            series += [("plain", "C0", "plain morris")] if p == "a" else []
            series += [("miss", "C1", "cache miss"), ("hit", "C2", "cache hit")]
            ks = a.servers
            w = 0.8 / len(series)
            xs = list(range(len(ks)))
            top = 0
            for i, (name, col, label) in enumerate(series):
                ys = [(part["direct"] if name == "direct" else part[str(k)][name]) or 0 for k in ks]
                top = max(top, *ys)
                bars = ax.bar([x - 0.4 + w * (i + 0.5) for x in xs], ys, w, label=label, color=col)
                for bb, y in zip(bars, ys):
                    ax.annotate(f"{y:.0f}", (bb.get_x() + bb.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
            ax.hlines([part[str(k)]["bound"] for k in ks], [x - 0.4 for x in xs], [x + 0.4 for x in xs],
                      colors="k", linestyles="--", lw=1, label="min(direct, k x server goodput)")
            ax.set_xticks(xs, [f"k={k} servers" for k in ks])
            ax.set_ylabel("MiB/s (median)")
            ax.set_ylim(0, top * 1.35)
            ax.set_title(f"({p}) reading a {a.size // MiB} MiB file"
                         + (f", +{2 * a.delay_ms:g} ms RTT to home (TCP relay, not netem)" if p == "c" else ""),
                         fontsize=9)
            ax.legend(fontsize=7, ncol=3, loc="upper center")
        else:
            ns = a.entries
            xs = list(range(len(ns)))
            w = 0.8 / 3
            for i, (name, col, label) in enumerate((("direct", "#999999", "home direct (libnfs)"),
                                                     ("miss", "C1", "cache miss"), ("hit", "C2", "cache hit"))):
                ys = [s["listing"][str(n)][name] for n in ns]
                bars = ax.bar([x - 0.4 + w * (i + 0.5) for x in xs], ys, w, label=label, color=col)
                for bb, y in zip(bars, ys):
                    ax.annotate(f"{y:.3g}", (bb.get_x() + bb.get_width() / 2, y), ha="center", va="bottom", fontsize=6)
            pm = [PANACHE_LS.get(n, (None, None)) for n in ns]
            ax.scatter([x - 0.4 + w * 1.5 for x in xs], [m for m, _ in pm], marker="x", color="C1", label="Panache miss")
            ax.scatter([x - 0.4 + w * 2.5 for x in xs], [h for _, h in pm], marker="x", color="C2", label="Panache hit")
            ax.set_yscale("log")
            ax.set_xticks(xs, [f"{n:,}" for n in ns])
            ax.set_xlabel("entries")
            ax.set_ylabel("seconds (median, log)")
            ax.set_title("(b) listing a home directory", fontsize=9)
            ax.legend(fontsize=7)
    fig.suptitle(f"cache mode, {res['date']}: {res['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    log(f"wrote {out}")


# ------------------------------------------------------------------------------------ main
def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("500M"), help="the file read in (a)/(c)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--servers", default="1,2,4", help="volume sizes k (one volume each)")
    ap.add_argument("--entries", default="100,1000,10000,100000", help="(b) directory sizes")
    ap.add_argument("--list-servers", type=int, default=None, help="(b) on the volume of this k (default: largest)")
    ap.add_argument("--parts", default="abc", help="which experiments: a (reads), b (listing), c (reads +30 ms)")
    ap.add_argument("--no-delay", action="store_true", help="same as leaving c out of --parts")
    ap.add_argument("--delay-ms", type=float, default=15.0, help="(c) relay delay each way (15: +30 ms RTT)")
    ap.add_argument("--nfs-depth", type=int, default=16, help="libnfs 1 MiB READs in flight for direct reads")
    ap.add_argument("--server-rate", default="200mbit")
    ap.add_argument("--home-rate", default="800mbit")
    ap.add_argument("--client-rate", default="800mbit")
    ap.add_argument("--morris-readahead", default=None, help="passed to every `morris mount --readahead`")
    ap.add_argument("--cold-home", action="store_true", help="do not warm home's page cache before home reads")
    ap.add_argument("--list-relay", action="store_true",
                    help="(b) list home through the delaying relay of (c) (direct and cache alike)")
    ap.add_argument("--no-nfs-ls", action="store_true", help="(b) skip the nfs-ls cross-check")
    ap.add_argument("--list-cold", action="store_true",
                    help="(b) drop every page cache before each listing (default: only the mount is fresh)")
    ap.add_argument("--no-data-check", action="store_true", help="skip the untimed SHA-256 check of cached reads")
    ap.add_argument("--no-duplex", action="store_true", help="(a) skip the duplex TCP measurement")
    ap.add_argument("--no-ack-prio", action="store_true",
                    help="plain tbf FIFOs (default: pure ACKs ahead of data in each link's queue, "
                         "bench/cluster/hosts.py Cluster(ack_prio=True))")
    ap.add_argument("--tbf-latency-ms", type=int, default=50,
                    help="tbf queue of every link in ms (bench/cluster's default: 50)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prefix", default="cb-")
    ap.add_argument("--subnet", default="10.83.0")
    ap.add_argument("--keep-workdir", action="store_true", help="keep server/mount/ganesha logs (path printed)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results-cache.json"))
    ap.add_argument("--png", default=os.path.join(REPO, "docs", "cache.png"))
    a = ap.parse_args()
    a.servers = sorted({int(x) for x in a.servers.split(",") if x})
    a.entries = [int(x) for x in a.entries.split(",") if x]
    a.parts = "".join(p for p in "abc" if p in a.parts and not (p == "c" and a.no_delay))
    if not a.parts:
        ap.error("nothing to run (--parts)")
    a.list_servers = a.list_servers or max(a.servers)
    if a.list_servers not in a.servers:
        ap.error("--list-servers must be one of --servers")
    return a


def jobs_for(b, a, raw):
    """Every configuration of one repetition, as (label, callable(rep)) in a fixed base order."""
    jobs = []
    if "a" in a.parts:
        jobs.append(("direct", lambda rep: raw["direct"].append(run_direct(b, rep, False))))
        for k in a.servers:
            if not a.no_duplex:
                jobs.append((f"duplex k={k}", lambda rep, k=k: raw["duplex"][str(k)].append(run_duplex(b, rep, k))))
            jobs.append((f"plain k={k}", lambda rep, k=k: raw["plain"][str(k)].append(run_plain(b, rep, k))))
            jobs.append((f"cache k={k}", lambda rep, k=k: raw["cache"][str(k)].append(run_cache_pair(b, rep, k, False))))
    if "c" in a.parts:
        jobs.append(("direct+relay", lambda rep: raw["direct_relay"].append(run_direct(b, rep, True))))
        for k in a.servers:
            jobs.append((f"cache+relay k={k}",
                         lambda rep, k=k: raw["cache_relay"][str(k)].append(run_cache_pair(b, rep, k, True))))
    if "b" in a.parts:
        def listing(rep):
            name = f"L{rep}"
            b.bind(a.list_servers, name, b.url("ls", a.list_relay))
            order = a.entries[rep % len(a.entries):] + a.entries[:rep % len(a.entries)]
            for n in order:
                raw["listing"][str(n)].append(run_listing(b, rep, n, a.list_servers, name))
        jobs.append(("listing", listing))
    return jobs


def main():
    a = parse_args()
    require_root_and_tools(("nsenter", "gcc", "nfs-ls"))
    if not os.access(MORRIS, os.X_OK):
        sys.exit(f"error: morris binary {MORRIS} not executable (set MORRIS_EXE)")
    srate, hrate, crate = parse_rate(a.server_rate), parse_rate(a.home_rate), parse_rate(a.client_rate)
    srv_goodput, home_goodput = goodput_mib(srate), goodput_mib(min(hrate, crate))
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    binary = binary_id(MORRIS)
    n_hosts = 2 + max(a.servers)
    rates = {0: hrate, 1: crate, **{i: srate for i in range(2, n_hosts)}}
    raw = {"direct": [], "plain": {str(k): [] for k in a.servers}, "cache": {str(k): [] for k in a.servers},
           "duplex": {str(k): [] for k in a.servers},
           "direct_relay": [], "cache_relay": {str(k): [] for k in a.servers},
           "listing": {str(n): [] for n in a.entries}}
    res = {"experiment": "cache", "date": started, "command": "python3 bench/cache.py " + " ".join(sys.argv[1:]),
           "commit": git("rev-parse", "--short", "HEAD"),
           "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
           "morris_binary": binary, "args": vars(a), "rates_bps": {"server": srate, "home": hrate, "client": crate},
           "goodput_mib_s": {"server": srv_goodput, "home_client": home_goodput}, "raw": raw}
    failure = None
    with Cluster(n_hosts, srate, rates=rates, prefix=a.prefix, subnet=a.subnet, keep_workdir=a.keep_workdir,
                 latency_ms=a.tbf_latency_ms, ack_prio=not a.no_ack_prio) as cl:
        if a.keep_workdir:
            log(f"work dir (kept): {cl.workdir}")
        try:
            res["verify_before"] = cl.verify(log=log)
        except ShapingError as e:
            sys.exit(f"refused: {e}")
        b = Bench(cl, a)
        try:
            b.setup_home()
            b.setup_volumes()
            res["home_sha256"] = b.home_sum
            res["rtt"] = {"direct": measure_rtt(b.client, b.home.addr, NFS_PORT)}
            if "c" in a.parts or a.list_relay:
                b.start_relay()
                res["rtt"]["relay"] = measure_rtt(b.client, b.home.addr, RELAY_NFS)
                res["rtt"]["relay_from_server"] = measure_rtt(b.servers[0], b.home.addr, RELAY_NFS)
            for p, r in res["rtt"].items():
                log(f"NFS NULL round trip {p}: median {r['median_ms']:.2f} ms (min {r['min_ms']:.2f}, max {r['max_ms']:.2f})")
            jobs = jobs_for(b, a, raw)
            for rep in range(a.runs):
                k0 = rep * len(jobs) // max(a.runs, 1)
                for label, job in jobs[k0:] + jobs[:k0]:
                    job(rep)
            if "a" in a.parts and not a.no_data_check:
                res["data_check"] = {str(k): verify_data(b, k) for k in a.servers}
            res["cache_status_end"] = {str(k): b.status(k)[1] for k in a.servers}
        except BaseException as e:
            failure = f"{type(e).__name__}: {e}"
            log(f"FAILED: {failure}")
            for h in b.servers + [b.client]:
                for fn in sorted(os.listdir(h.dir)):
                    if fn.endswith(".log"):
                        with open(os.path.join(h.dir, fn), errors="replace") as f:
                            tail = f.read().splitlines()[-15:]
                        log(f"--- tail of {h.ns}/{fn}:\n" + "\n".join(tail))
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            res["log_warnings"] = {h.ns: log_warnings(h.dir) for h in b.servers + [b.client]}
            b.stop()
        if failure is None:
            try:
                res["verify_after"] = cl.verify(log=log)
            except ShapingError as e:
                failure = f"link shaping check after the runs failed: {e}"
    if failure is not None:
        res["failure"] = failure
        with open(a.out + ".failed", "w") as f:
            json.dump(res, f, indent=1)
        log(f"raw figures so far in {a.out}.failed")
        sys.exit(f"cache.py: {failure}")
    res["summary"], res["goals"] = summarize(res, a, srv_goodput)
    res["table"] = table(res, a, srv_goodput, home_goodput)
    res["machine"] = {"nproc": os.cpu_count(), "loadavg_end": os.getloadavg()}
    now = binary_id(MORRIS)
    if now != binary:
        res["morris_binary_changed_during_run_to"] = now
        log(f"WARNING: {MORRIS} was replaced during the run; figures mix two builds")
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    log(f"wrote {a.out}")
    plot(res, a, a.png)
    print("\n".join(res["table"]))


if __name__ == "__main__":
    main()
