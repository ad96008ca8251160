"""File systems run on a Cluster: morris (servers + FUSE mounts), a single nfs-ganesha server read
with libnfs, MooseFS (master + chunkservers + mfsmount); plus the concurrent-reader harness."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from .hosts import drop_caches, is_mounted, killpg, umount

MiB = 1 << 20
BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MORRIS = os.environ.get("MORRIS_EXE", "/work/bin/morris")

if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
from lib.loopback import make_keys  # noqa: E402


def cluster_keys(cl, exe=MORRIS):
    """The key files of every morris volume on cluster cl (lib.loopback.Keys): made once per
    cluster by `morris key new WORKDIR/keys`, reused while that dir holds them. The hosts are
    network namespaces on one file system, so the same paths work in every host: servers,
    format, status and `morris cache` get .volume, mounts .client."""
    return make_keys(exe, os.path.join(cl.workdir, "keys"))


def wait_port(host, addr, port, timeout=30):
    code = ("import socket,sys,time\nt=time.time()\nwhile time.time()-t<%f:\n"
            " try:\n  socket.create_connection((%r,%d),timeout=1).close(); sys.exit(0)\n"
            " except OSError: time.sleep(0.05)\nsys.exit(1)\n" % (timeout, addr, port))
    if host.run(["python3", "-c", code], check=False).returncode != 0:
        raise RuntimeError(f"{addr}:{port} not reachable from {host.ns} within {timeout}s")


def write_file(path, size, seed=1, bs=MiB):
    """Write `size` bytes of deterministic pseudo-random data; returns MiB/s (incl. fsync)."""
    import random
    rng = random.Random(seed)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left > 0:
            n = min(bs, left)
            os.write(fd, rng.randbytes(n))
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)
    return size / MiB / (time.perf_counter() - t)


# ------------------------------------------------------------------------------------ morris
class Morris:
    """k morris stripe servers (one per host) formatted as one volume; FUSE mounts in client hosts.
    self.keys: the key files (cluster_keys(cl)) every morris command here is given."""

    def __init__(self, cl, server_hosts, port=7700, stripe_unit=None, exe=MORRIS, lease_ms=10000, mount_args=(),
                 replicas=1):
        self.cl, self.servers, self.port, self.exe = cl, list(server_hosts), port, exe
        self.mount_args = list(mount_args)  # extra `morris mount` options for every mount
        self.addrs = [f"{h.addr}:{port}" for h in self.servers]
        self.procs = []
        self.mounts = {}
        self.keys = cluster_keys(cl, exe)
        tag = f"morris-{port}"
        for h in self.servers:
            d = os.path.join(h.dir, tag)
            os.makedirs(d, exist_ok=True)
            self.procs.append(h.spawn([exe, "server", "--key", self.keys.volume, "--data", d,
                                       "--listen", f"{h.addr}:{port}", "--lease-ms", str(lease_ms)],
                                      log=os.path.join(h.dir, f"{tag}.log")))
        for h in self.servers:
            wait_port(self.servers[0], h.addr, port)
        args = [exe, "format", "--key", self.keys.volume, "--servers", ",".join(self.addrs)]
        if stripe_unit:
            args += ["--stripe-unit", stripe_unit]
        if replicas > 1:
            args += ["--replicas", str(replicas)]
        self.servers[0].run(args)

    def mount(self, host, name="morris", extra=()):
        mnt = os.path.join(host.dir, name)
        os.makedirs(mnt, exist_ok=True)
        if is_mounted(mnt):
            raise RuntimeError(f"{mnt} already mounted")
        self.cl.add_mount(mnt)
        host.run([self.exe, "mount", "--key", self.keys.client, self.addrs[0], mnt, "--background", "--log",
                  os.path.join(host.dir, f"{name}-mount.log"), *self.mount_args, *extra], timeout=60)
        if not is_mounted(mnt):
            raise RuntimeError(f"morris mount in {host.ns} did not come up")
        self.cl.note_mount(mnt)
        self.mounts[host.ns] = mnt
        return mnt

    def umount(self, host):
        mnt = self.mounts.pop(host.ns, None)
        if mnt:
            subprocess.run([self.exe, "umount", mnt], capture_output=True)
            umount(mnt)
            self.cl.forget_mount(mnt)

    def umount_all(self):
        for ns in list(self.mounts):
            h = next(h for h in self.cl.hosts if h.ns == ns)
            self.umount(h)

    def status(self):
        out = self.servers[0].run([self.exe, "status", "--key", self.keys.volume, self.addrs[0], "--json",
                                   "--ops"]).stdout
        return json.loads(out)

    def op_counts(self):
        """{server address: {op: count}} from `morris status --json`."""
        st = self.status()
        res = {}
        for i, srv in enumerate(st.get("servers", [])):
            ops = {}
            for name, n in (srv.get("stats") or {}).get("requests_by_op", []):
                ops[name] = n
            res[srv.get("addr", str(i))] = ops
        return res

    def stop(self):
        self.umount_all()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


# ------------------------------------------------------------------------------------ readers
_READER = r"""
import os, sys, time
path = sys.argv[1]; bs = 1 << 20
print("ready", flush=True); sys.stdin.readline()
t0 = time.time(); fd = os.open(path, os.O_RDONLY); n = 0
while True:
    b = os.read(fd, bs)
    if not b: break
    n += len(b)
os.close(fd); print(n, t0, time.time(), flush=True)
"""

# libnfs reader: nfs-cat URL, counted by this wrapper (nfs-cat writes the file to stdout).
_NFSREADER = r"""
import subprocess, sys, time
url = sys.argv[1]
print("ready", flush=True); sys.stdin.readline()
t0 = time.time()
p = subprocess.Popen(["nfs-cat", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
n = 0
while True:
    b = p.stdout.read1(1 << 20)
    if not b: break
    n += len(b)
err = p.stderr.read(); rc = p.wait()
if rc != 0:
    print("nfs-cat failed", rc, err.decode(errors="replace"), file=sys.stderr); sys.exit(1)
print(n, t0, time.time(), flush=True)
"""


class CpuMeter:
    """Whole-machine CPU busy fraction (of all cores) between start() and stop()."""

    @staticmethod
    def _read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        steal = v[7] if len(v) > 7 else 0
        return sum(v[:8]), idle, steal

    def start(self):
        self.a = self._read()

    def stop(self):
        b = self._read()
        tot = b[0] - self.a[0]
        return {"busy": 1 - (b[1] - self.a[1]) / tot if tot else 0.0,
                "steal": (b[2] - self.a[2]) / tot if tot else 0.0}


def concurrent_reads(jobs, expect_size=None, timeout=3600):
    """jobs: list of (host, argv) readers printing 'ready', waiting for a line on stdin, then
    printing 'bytes t_start t_end'. All start together. Returns dict with per-reader MiB/s,
    aggregate MiB/s (all bytes / first start..last end), CPU use and each host's link bytes."""
    procs = []
    cpu = CpuMeter()
    try:
        for h, argv in jobs:
            procs.append((h, h.spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)))
        for h, p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"reader in {h.ns} failed: {p.stderr.read()}")
        all_hosts = jobs[0][0].cluster.hosts
        links0 = {h.ns: h.link_bytes() for h in all_hosts}
        sampler = LinkSampler(all_hosts)
        sampler.start()
        cpu.start()
        for h, p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = []
        for h, p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"reader in {h.ns} exited {p.returncode}: {err.strip()[-1500:]}")
            last = out.strip().splitlines()[-1]
            if last.startswith("{"):  # bench/lib/nfsread JSON line
                j = json.loads(last)
                res.append((int(j["bytes"]), float(j["t0"]), float(j["t1"])))
            else:
                n, t0, t1 = last.split()
                res.append((int(n), float(t0), float(t1)))
        c = cpu.stop()
        sampler.stop()
        links1 = {h.ns: h.link_bytes() for h in all_hosts}
    finally:
        if "sampler" in locals():
            sampler.stop()
        for h, p in procs:
            if p.poll() is None:
                killpg(p)
                p.wait()
    for n, _, _ in res:
        if expect_size is not None and n != expect_size:
            raise RuntimeError(f"a reader got {n} bytes, expected {expect_size}")
    start = min(r[1] for r in res)
    end = max(r[2] for r in res)
    links = {ns: {"rx_MiB": (links1[ns][0] - links0[ns][0]) / MiB, "tx_MiB": (links1[ns][1] - links0[ns][1]) / MiB}
             for ns in links0}
    return {"per_client": [n / MiB / (t1 - t0) for n, t0, t1 in res],
            "aggregate": sum(r[0] for r in res) / MiB / (end - start),
            "wall_s": end - start, "cpu": c, "links": links, "link_series": sampler.series()}


class LinkSampler:
    """Samples every host's link byte counters every `period` s in a thread, so per-link
    utilisation over time (hot servers, idle links) can be read from the results."""

    def __init__(self, hosts, period=0.5):
        import threading
        self.hosts, self.period = hosts, period
        self.samples = []
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            self.samples.append((time.time(), [h.link_bytes() for h in self.hosts]))
            self._stop.wait(self.period)

    def start(self):
        self._th.start()

    def stop(self):
        self._stop.set()
        if self._th.is_alive():
            self._th.join()

    def series(self):
        """{ns: {"t": [...], "rx_MiBps": [...], "tx_MiBps": [...]}} per sampling interval."""
        out = {h.ns: {"t": [], "rx_MiBps": [], "tx_MiBps": []} for h in self.hosts}
        for (t0, a), (t1, b) in zip(self.samples, self.samples[1:]):
            dt = t1 - t0
            if dt <= 0:
                continue
            for h, x, y in zip(self.hosts, a, b):
                o = out[h.ns]
                o["t"].append(round(t1 - self.samples[0][0], 2))
                o["rx_MiBps"].append(round((y[0] - x[0]) / MiB / dt, 2))
                o["tx_MiBps"].append(round((y[1] - x[1]) / MiB / dt, 2))
        return out


def fuse_reader(host, path):
    return (host, ["python3", "-c", _READER, path])


def nfs_reader(host, url, nfsread=None, depth=4):
    """libnfs reader: bench/lib/nfsread (compiled by build_nfsread) with `depth` 1 MiB READ calls
    in flight (as a kernel client's readahead would), or nfs-cat if nfsread is None."""
    if nfsread:
        return (host, [nfsread, "-w", "-c", str(MiB), "-d", str(depth), url])
    return (host, ["python3", "-c", _NFSREADER, url])


def build_nfsread(outdir):
    src = os.path.join(BENCH, "lib", "nfsread.c")
    if not os.path.exists(src):
        raise RuntimeError(f"{src} missing (libnfs reader of the ganesha helper)")
    out = os.path.join(outdir, "nfsread")
    r = subprocess.run(["gcc", "-O2", "-o", out, src, "-lnfs"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building nfsread failed: {r.stderr}")
    return out


# ------------------------------------------------------------------------------------ ganesha
def ganesha_class():
    """The Ganesha wrapper from bench/lib/ganesha.py (written by another helper)."""
    p = os.path.join(BENCH, "lib", "ganesha.py")
    if not os.path.exists(p):
        raise RuntimeError(f"{p} does not exist yet (the ganesha wrapper); cannot run the NFS baseline")
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    from lib.ganesha import Ganesha  # noqa: E402
    return Ganesha


# ------------------------------------------------------------------------------------ MooseFS
class MooseFS:
    """mfsmaster in one host, one mfschunkserver per server host, mfsmount per client host.
    Goal (copies) 1, to compare with unmirrored morris. All MooseFS daemons run at nice 0."""

    def __init__(self, cl, master_host, chunk_hosts):
        self.cl, self.master, self.chunks = cl, master_host, list(chunk_hosts)
        self.procs, self.mounts = [], {}
        for t in ("mfsmaster", "mfschunkserver", "mfsmount"):
            if not shutil.which(t):
                raise RuntimeError(f"{t} not installed")
        m = master_host
        mdir = os.path.join(m.dir, "mfsmaster")
        os.makedirs(mdir, exist_ok=True)
        empty = "/var/lib/mfs/metadata.mfs.empty"
        if not os.path.exists(os.path.join(mdir, "metadata.mfs")):
            shutil.copy(empty, os.path.join(mdir, "metadata.mfs"))
        exports = os.path.join(mdir, "mfsexports.cfg")
        with open(exports, "w") as f:
            f.write("*  /  rw,alldirs,maproot=0\n")
        mcfg = os.path.join(mdir, "mfsmaster.cfg")
        with open(mcfg, "w") as f:
            f.write(f"WORKING_USER = root\nWORKING_GROUP = root\nDATA_PATH = {mdir}\n"
                    f"EXPORTS_FILENAME = {exports}\nTOPOLOGY_FILENAME = {os.path.join(mdir, 'mfstopology.cfg')}\n"
                    f"MATOML_LISTEN_HOST = {m.addr}\nMATOCS_LISTEN_HOST = {m.addr}\nMATOCL_LISTEN_HOST = {m.addr}\n"
                    f"MATOCS_LISTEN_PORT = 9420\nMATOCL_LISTEN_PORT = 9421\nMATOML_LISTEN_PORT = 9419\n"
                    f"LOCK_MEMORY = 0\nAUTO_RECOVERY = 1\nNICE_LEVEL = 0\n")
        open(os.path.join(mdir, "mfstopology.cfg"), "a").close()
        self.procs.append(m.spawn(["mfsmaster", "-c", mcfg, "-f", "start"], log=os.path.join(m.dir, "mfsmaster.log")))
        wait_port(m, m.addr, 9421)
        for h in self.chunks:
            d = os.path.join(h.dir, "mfschunk")
            os.makedirs(os.path.join(d, "hdd"), exist_ok=True)
            hdd = os.path.join(d, "mfshdd.cfg")
            with open(hdd, "w") as f:
                f.write(os.path.join(d, "hdd") + "\n")
            cfg = os.path.join(d, "mfschunkserver.cfg")
            with open(cfg, "w") as f:
                f.write(f"WORKING_USER = root\nWORKING_GROUP = root\nDATA_PATH = {d}\nHDD_CONF_FILENAME = {hdd}\n"
                        f"MASTER_HOST = {m.addr}\nMASTER_PORT = 9420\nBIND_HOST = {h.addr}\n"
                        f"CSSERV_LISTEN_HOST = {h.addr}\nCSSERV_LISTEN_PORT = 9422\nLOCK_MEMORY = 0\n"
                        f"HDD_LEAVE_SPACE_DEFAULT = 1GiB\nNICE_LEVEL = 0\n")
            self.procs.append(h.spawn(["mfschunkserver", "-c", cfg, "-f", "start"],
                                      log=os.path.join(h.dir, "mfschunkserver.log")))
        for h in self.chunks:
            wait_port(m, h.addr, 9422)
        self._wait_chunkservers()

    def _wait_chunkservers(self, timeout=60):
        # No mfscli here: wait until every chunkserver logs its registration with the master.
        t = time.time()
        logs = [os.path.join(h.dir, "mfschunkserver.log") for h in self.chunks]
        while time.time() - t < timeout:
            ok = 0
            for lg in logs:
                try:
                    txt = open(lg, errors="replace").read().lower()
                except OSError:
                    txt = ""
                if "connected to master" in txt and ": complete" in txt:
                    ok += 1
            if ok == len(logs):
                time.sleep(1.0)
                return
            time.sleep(0.3)
        raise RuntimeError("MooseFS chunkservers did not register with the master; see " + ", ".join(logs))

    def mount(self, host, name="mfs"):
        mnt = os.path.join(host.dir, name)
        os.makedirs(mnt, exist_ok=True)
        self.cl.add_mount(mnt)
        # mfsnice=0 / NICE_LEVEL=0: MooseFS renices itself to -19 by default, which would give it
        # the CPU ahead of morris and ganesha on this shared 2-core machine.
        host.run(["mfsmount", "-H", self.master.addr, "-P", "9421", "-o", "mfsnice=0", mnt], timeout=60)
        for _ in range(100):
            if is_mounted(mnt):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"mfsmount in {host.ns} did not come up")
        for _ in range(300):  # until the master reports the chunkservers' space
            st = os.statvfs(mnt)
            if st.f_blocks > 0:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("MooseFS reports no space: chunkservers not registered")
        self.cl.note_mount(mnt)
        self.mounts[host.ns] = mnt
        return mnt

    def umount(self, host):
        mnt = self.mounts.pop(host.ns, None)
        if mnt:
            umount(mnt)
            self.cl.forget_mount(mnt)

    def umount_all(self):
        for ns in list(self.mounts):
            self.umount(next(h for h in self.cl.hosts if h.ns == ns))

    def stop(self):
        self.umount_all()
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def morris_beside_moosefs(cl, exe):
    """On a Cluster of 5 hosts: 4 morris servers (one copy) on h1..h4 and MooseFS (master on h4,
    chunkservers on h1..h3, goal 1), both mounted on h0. Returns (morris, moosefs,
    {"morris": mount point, "moosefs": mount point})."""
    mo = Morris(cl, cl.hosts[1:5], exe=exe)
    mfs = MooseFS(cl, cl.hosts[4], cl.hosts[1:4])
    client = cl.hosts[0]
    return mo, mfs, {"morris": mo.mount(client), "moosefs": mfs.mount(client)}


def cold():
    """Every page cache dropped (client and server side; all hosts share this kernel)."""
    drop_caches()
