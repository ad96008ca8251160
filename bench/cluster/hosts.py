"""Emulated hosts: network namespaces joined by veth pairs to one bridge, each host's link
shaped with tbf in both directions.

    from cluster import Cluster
    with Cluster(6, "200mbit", rates={5: "800mbit"}) as cl:   # hosts h0..h5
        cl.verify()                        # socket throughput check; raises ShapingError if off
        h = cl.hosts[0]
        h.run(["ip", "addr"])              # runs inside the namespace (blocking)
        p = h.spawn(["morris", "server", "--key", VOLUME_KEY, ...], log="srv.log")   # Popen, killed at teardown
        cl.link_down(h); cl.link_up(h)     # cut / restore the host's link (qdiscs kept)
        cl.stop_host(h)                    # SIGKILL every process in the host (a crash)
    # teardown: kills every process inside the namespaces, unmounts registered mounts,
    # deletes namespaces, veths and the bridge -- also after an exception, SIGINT or SIGTERM.

Names: namespaces PREFIX-h<i>, bridge PREFIX-br, host-side veths PREFIX-v<i>; inside each namespace
the interface is "mcif" with address SUBNET.<i+1>/24 (SUBNET defaults to 10.77.0). Nothing
outside this subnet and these names is touched.
"""

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

PREFIX = "mc-"
SUBNET = "10.77.0"
NS_IF = "mcif"
MTU = 1500
# TCP payload per wire byte that tbf counts (1500-byte packets: 20 IP + 32 TCP with timestamps,
# plus the 14-byte Ethernet header tbf sees on a veth).
PAYLOAD_EFF = (MTU - 20 - 32) / (MTU + 14)


class ShapingError(RuntimeError):
    """The links are not shaped as configured: no figure may be reported."""


def parse_rate(r):
    """'200mbit' / '1gbit' / '500kbit' / bits-per-second int -> bits per second."""
    if isinstance(r, (int, float)):
        return int(r)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)(bit|bps)?\s*", r.lower())
    if not m:
        raise ValueError(f"bad rate {r!r} (e.g. 200mbit)")
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)]
    v = float(m.group(1)) * mult
    if m.group(3) == "bps":  # bytes per second, as tc spells it
        v *= 8
    return int(v)


def fmt_rate(bps):
    return f"{bps / 1e6:g}mbit"


def sh(cmd, check=True, quiet=False, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {r.returncode}: {r.stderr.strip()}")
    return r


def require_root_and_tools(extra=()):
    if os.geteuid() != 0:
        sys.exit("error: needs root (network namespaces, tc, FUSE, drop_caches)")
    for t in ("ip", "tc", "fusermount3", *extra):
        if not shutil.which(t):
            sys.exit(f"error: required tool {t!r} not found in PATH")


def killpg(p, sig=signal.SIGKILL):
    """Signal the process group of Popen `p` (started with start_new_session) if it still runs."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# Tiny socket tools run inside namespaces for the shaping check.
_SINK = r"""
import socket, sys, time
port, dur, warm = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen(16); print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); t0 = time.perf_counter(); n = 0; tw = None
while True:
    k = c.recv_into(buf)
    if k == 0: break
    now = time.perf_counter()
    if tw is None and now - t0 >= warm: tw, n = now, 0
    n += k
    if now - t0 >= warm + dur: break
print(n * 8 / (time.perf_counter() - tw) if tw else 0.0, flush=True)
c.close()
"""
_SRC = r"""
import socket, sys, time
addr, port, dur = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for _ in range(100):
    try: s = socket.create_connection((addr, port), timeout=5); break
    except OSError: time.sleep(0.05)
buf = b"\0" * (1 << 20); t0 = time.perf_counter()
try:
    while time.perf_counter() - t0 < dur: s.sendall(buf)
except OSError: pass
"""


class Host:
    """One emulated machine: a network namespace with one shaped link to the bridge."""

    def __init__(self, cluster, idx, rate_bps):
        self.cluster, self.idx, self.rate = cluster, idx, rate_bps
        self.ns = f"{cluster.prefix}h{idx}"
        self.veth = f"{cluster.prefix}v{idx}"  # host side, on the bridge
        self.addr = f"{cluster.subnet}.{idx + 1}"
        self.procs = []

    @property
    def dir(self):
        """This host's scratch directory (under the cluster's work dir)."""
        return os.path.join(self.cluster.workdir, self.ns)

    def __repr__(self):
        return f"<Host {self.ns} {self.addr} {fmt_rate(self.rate)}>"

    def cmd(self, argv):
        # nsenter --net (not `ip netns exec`): only the network namespace changes, so FUSE mounts
        # made inside a host are visible (and unmountable) from the root mount namespace.
        return ["nsenter", f"--net=/run/netns/{self.ns}", "--", *argv]

    def run(self, argv, check=True, timeout=None, **kw):
        """Run argv inside the host (blocking); returns CompletedProcess (text, captured)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        r = subprocess.run(self.cmd(argv), timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"[{self.ns}] {' '.join(argv)} -> {r.returncode}: {(r.stderr or '').strip()[-2000:]}")
        return r

    def spawn(self, argv, log=None, **kw):
        """Start argv inside the host in its own process group; killed at teardown."""
        if log is not None:
            f = open(log, "ab")
            kw.setdefault("stdout", f)
            kw.setdefault("stderr", subprocess.STDOUT)
        p = subprocess.Popen(self.cmd(argv), start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def kill_children(self, sig=signal.SIGKILL, wait=3.0):
        """Signal the process groups this harness spawned in the host (not detached daemons)."""
        for p in self.procs:
            killpg(p, sig)
        deadline = time.time() + wait
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass

    def pids(self):
        r = sh(["ip", "netns", "pids", self.ns], check=False)
        return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []

    def kill_all(self, sig=signal.SIGKILL, wait=5.0):
        """Signal every process living in this namespace (all were started by this harness)."""
        for p in self.procs:
            killpg(p, sig)
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while time.time() < deadline and self.pids():
            time.sleep(0.05)
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        self.procs = [p for p in self.procs if p.poll() is None]

    def link_bytes(self):
        """(bytes received by the host, bytes sent by the host) on its link."""
        base = f"/sys/class/net/{self.veth}/statistics/"
        rx_host = int(open(base + "tx_bytes").read())  # bridge -> host
        tx_host = int(open(base + "rx_bytes").read())  # host -> bridge
        return rx_host, tx_host


class Cluster:
    """N hosts (network namespaces) on one bridge; host i's link is shaped to rates[i]."""

    def __init__(self, n_hosts, rate="200mbit", rates=None, prefix=PREFIX, subnet=SUBNET,
                 workdir=None, burst=None, latency_ms=50, keep_workdir=False, ack_prio=False):
        if n_hosts < 1 or n_hosts > 200:
            raise ValueError("1..200 hosts")
        self.prefix, self.subnet = prefix, subnet
        self.bridge = f"{prefix}br"
        self._workdir = workdir  # created by setup() (a Cluster never set up leaves nothing behind)
        self.keep_workdir = keep_workdir
        self.latency_ms = latency_ms
        self.burst = burst
        # ack_prio: under each tbf a prio qdisc sends pure TCP ACKs (and other
        # packets under 128 bytes) ahead of the data queued in the same
        # direction. Without it, a host whose link is full both ways (a
        # cache server fetching from home while it sends to a client) holds
        # the ACKs of one flow behind up to latency_ms of the other's data,
        # and the first flow falls to a fraction of its rate: an artefact of
        # one deep FIFO per direction (a real NIC's queue drains at line
        # rate and holds microseconds). Opt-in, so that earlier experiments
        # keep their setup.
        self.ack_prio = ack_prio
        rates = rates or {}
        self.hosts = [Host(self, i, parse_rate(rates.get(i, rate))) for i in range(n_hosts)]
        self.mounts = []  # mount points to unmount at teardown
        self.fuse_conns = set()  # FUSE connection ids of our mounts
        self._up = False
        self._torn = False
        self._lock = threading.Lock()
        self._old_handlers = {}

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def _on_signal(self, signum, frame):
        # Turn SIGTERM/SIGHUP into an exception so every finally: block (and teardown) runs.
        raise KeyboardInterrupt(f"signal {signum}")

    def _take_lock(self):
        """One live cluster per prefix: setup removes every leftover of its prefix, which would
        destroy a cluster another process is still using."""
        import fcntl
        path = f"/run/lock/{self.prefix}cluster.lock"
        self._lockf = open(path, "a+")
        try:
            fcntl.flock(self._lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lockf.seek(0)
            who = self._lockf.read().strip()
            self._lockf.close()
            raise RuntimeError(f"another cluster with prefix {self.prefix!r} is running (pid {who or '?'}); "
                               f"wait for it or use another --prefix/--subnet") from None
        self._lockf.seek(0)
        self._lockf.truncate()
        self._lockf.write(str(os.getpid()))
        self._lockf.flush()

    @property
    def workdir(self):
        if self._workdir is None:
            raise RuntimeError("Cluster.workdir before setup()")
        return self._workdir

    def setup(self):
        self._take_lock()
        cleanup_leftovers(self.prefix)
        if self._workdir is None:
            self._workdir = tempfile.mkdtemp(prefix=f"{self.prefix}cluster-", dir="/var/tmp")
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[s] = signal.signal(s, self._on_signal)
            except ValueError:  # not the main thread
                pass
        atexit.register(self.teardown)
        self._up = True
        try:
            sh(["ip", "link", "add", self.bridge, "type", "bridge"])
            sh(["ip", "link", "set", self.bridge, "up"])
            for h in self.hosts:
                os.makedirs(h.dir, exist_ok=True)
                sh(["ip", "netns", "add", h.ns])
                sh(["ip", "link", "add", h.veth, "mtu", str(MTU), "type", "veth", "peer", "name", NS_IF,
                    "netns", h.ns])
                sh(["ip", "link", "set", h.veth, "master", self.bridge])
                sh(["ip", "link", "set", h.veth, "up"])
                h.run(["ip", "link", "set", "lo", "up"])
                h.run(["ip", "addr", "add", f"{h.addr}/24", "dev", NS_IF])
                h.run(["ip", "link", "set", NS_IF, "mtu", str(MTU), "up"])
                self.shape(h)
        except BaseException:
            self.teardown()
            raise

    def _tbf_args(self, rate):
        # burst: >= one 64 KiB GSO segment and ~2 ms at the rate, so tbf neither drops
        # nor resegments TSO packets and long-run throughput sits at the rate.
        burst = self.burst or max(128 * 1024, int(rate / 8 * 0.002))
        return ["tbf", "rate", str(rate), "burst", str(burst), "latency", f"{self.latency_ms}ms"]

    def shape(self, h, rate=None):
        """(Re)apply tbf at `rate` (default: the host's) on both ends of the host's link."""
        if rate is not None:
            h.rate = parse_rate(rate)
        args = self._tbf_args(h.rate)
        if not self.ack_prio:
            sh(["tc", "qdisc", "replace", "dev", h.veth, "root", *args])  # traffic into the host
            h.run(["tc", "qdisc", "replace", "dev", NS_IF, "root", *args])  # traffic out of the host
            return
        # ack_prio: htb (this kernel has neither prio nor fq_codel) with the
        # host's rate split in two classes that may each use all of it: small
        # packets (IPv4 under 128 bytes: pure ACKs, SYNs, small RPCs) first,
        # in a queue of their own; everything else in a byte FIFO as deep as
        # tbf's latency.
        rate = int(h.rate)
        burst = self.burst or max(128 * 1024, int(rate / 8 * 0.002))
        limit = max(2 * burst, int(rate / 8 * self.latency_ms / 1000))
        quantum = 60000
        for run, dev in ((sh, h.veth), (h.run, NS_IF)):
            run(["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20"])
            run(["tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                 "rate", str(rate), "ceil", str(rate), "burst", str(burst), "cburst", str(burst),
                 "quantum", str(quantum)])
            for cid, share, prio in (("1:10", rate // 10, 0), ("1:20", rate - rate // 10, 1)):
                run(["tc", "class", "replace", "dev", dev, "parent", "1:1", "classid", cid, "htb",
                     "rate", str(share), "ceil", str(rate), "burst", str(burst), "cburst", str(burst),
                     "prio", str(prio), "quantum", str(quantum)])
            run(["tc", "qdisc", "replace", "dev", dev, "parent", "1:10", "handle", "10:", "bfifo",
                 "limit", str(256 * 1024)])
            run(["tc", "qdisc", "replace", "dev", dev, "parent", "1:20", "handle", "20:", "bfifo",
                 "limit", str(limit)])
            run(["tc", "filter", "replace", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
                 "u32", "match", "u16", "0x0000", "0xff80", "at", "2", "flowid", "1:10"])

    def qdisc_ok(self, h):
        """True if both tbf qdiscs of h are in place with h's rate."""
        want = h.rate
        outs = [sh(["tc", "-j", "qdisc", "show", "dev", h.veth]).stdout,
                h.run(["tc", "-j", "qdisc", "show", "dev", NS_IF]).stdout]
        import json
        for o in outs:
            if self.ack_prio:
                # htb: the rate is its classes'; the link check measures it.
                if not [x for x in json.loads(o) if x.get("kind") == "htb" and x.get("root")]:
                    return False
                continue
            q = [x for x in json.loads(o) if x.get("kind") == "tbf" and x.get("root")]
            if not q:
                return False
            rate_bytes = q[0].get("options", {}).get("rate")
            if rate_bytes is None or abs(rate_bytes * 8 - want) > want * 0.01:
                return False
        return True

    def teardown(self):
        with self._lock:
            if not self._up or self._torn:
                return
            self._torn = True
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if threading.current_thread() is threading.main_thread() else None
        try:
            # 1) our own children first (readers, blastn, servers...): a process still using a
            #    mount makes the unmount lazy, and its exit would then have to tear down a FUSE
            #    superblock whose daemon is gone (a stuck superblock blocks sync/drop_caches).
            for h in self.hosts:
                h.kill_children(signal.SIGTERM, wait=3)
                h.kill_children(signal.SIGKILL, wait=3)
            # 2) unmount (clean now), 3) then whatever still lives in the hosts (mount daemons).
            for m in reversed(self.mounts):
                umount(m)
            self.mounts.clear()
            for h in self.hosts:
                h.kill_all(signal.SIGTERM, wait=3)
                h.kill_all(signal.SIGKILL, wait=3)
            cleanup_leftovers(self.prefix, self._workdir)
            abort_stuck_fuse(self.fuse_conns)
            if not self.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        finally:
            lf = getattr(self, "_lockf", None)
            if lf is not None and not lf.closed:
                lf.close()  # releases the flock
            if old is not None:
                signal.signal(signal.SIGINT, old)
            for s, hnd in self._old_handlers.items():
                try:
                    signal.signal(s, hnd)
                except (ValueError, TypeError):
                    pass

    # ---------------------------------------------------------------- control
    def host(self, i):
        return self.hosts[i]

    def link_down(self, h):
        """Cut h's link (both directions) as a pulled cable would; processes keep running."""
        sh(["ip", "link", "set", h.veth, "down"])

    def link_up(self, h):
        sh(["ip", "link", "set", h.veth, "up"])
        if not self.qdisc_ok(h):
            self.shape(h)
        for _ in range(100):  # until the bridge forwards on the port again
            if "forwarding" in sh(["bridge", "link", "show", "dev", h.veth], check=False).stdout:
                break
            time.sleep(0.05)

    def stop_host(self, h, sig=signal.SIGKILL):
        """Stop a host: every process inside it gets sig (default SIGKILL, i.e. a crash)."""
        h.kill_all(sig)

    def add_mount(self, path):
        self.mounts.append(path)

    def note_mount(self, path):
        """Remember the FUSE connection of a mount that is up (see abort_stuck_fuse)."""
        try:
            d = os.stat(path).st_dev
            self.fuse_conns.add((os.major(d) << 20) | os.minor(d))
        except OSError:
            pass

    def forget_mount(self, path):
        if path in self.mounts:
            self.mounts.remove(path)

    # ---------------------------------------------------------------- verification
    def _stream(self, pairs, dur, warm, port=5299):
        """Run one TCP stream per (src, dst) pair at once; returns measured goodput (bit/s)
        at each dst, in pair order. Several pairs may share a dst (distinct ports)."""
        sinks, srcs = [], []
        try:
            for i, (s, d) in enumerate(pairs):
                p = d.spawn(["python3", "-c", _SINK, str(port + i), str(dur), str(warm)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                sinks.append(p)
            for p in sinks:
                line = p.stdout.readline()
                if line.strip() != "ready":
                    raise ShapingError(f"shaping check sink failed: {p.stderr.read()}")
            for i, (s, d) in enumerate(pairs):
                srcs.append(s.spawn(["python3", "-c", _SRC, d.addr, str(port + i), str(dur + warm + 1)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            out = []
            for p in sinks:
                try:
                    o, e = p.communicate(timeout=dur + warm + 30)
                except subprocess.TimeoutExpired:
                    raise ShapingError("shaping check: a stream did not finish (link down? bridge filter?)")
                try:
                    out.append(float(o.strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    raise ShapingError(f"shaping check: sink output {o!r} {e!r}")
            return out
        finally:
            for p in srcs + sinks:
                killpg(p)
                p.wait()

    def verify(self, hosts=None, dur=3.0, warm=1.0, lo=0.93, hi=1.03, log=print, attempts=3):
        """Link shaping check (see _verify_once); a check that is off is repeated up to
        `attempts` times (the machine is shared, a busy CPU can slow one stream), each link
        keeping its best attempt; a wrong rate fails every time. Raises ShapingError."""
        best = {}
        for i in range(attempts):
            try:
                rows = self._verify_once(hosts, dur, warm, lo, hi, log=log)
                return rows
            except ShapingError as e:
                rows = getattr(e, "rows", None)
                if rows is None:  # qdisc missing / not checkable: no point retrying
                    raise
                for r in rows:
                    name = r["link"]
                    ok = lo <= r["got_bps"] / r["expect_bps"] <= hi
                    if ok or name not in best:
                        best[name] = (ok, r)
                if all(ok for ok, _ in best.values()):
                    log(f"link shaping check passed on retry {i + 1} (each link's best attempt)")
                    return [r for _, r in best.values()]
                log(f"link shaping check attempt {i + 1} off:\n{e}")
        raise ShapingError("link shaping check FAILED %d times (refusing to report)" % attempts)

    def _verify_once(self, hosts=None, dur=3.0, warm=1.0, lo=0.93, hi=1.03, log=print):
        """Socket throughput check of every host's link, both directions.

        Round 1 (ring): every host sends one stream to the next host at once; each stream must
        reach min(rate_src, rate_dst) * PAYLOAD_EFF within [lo, hi].
        Round 2: each host faster than both ring neighbours is checked alone against enough
        senders (fan-in) and receivers (fan-out) to fill its link.
        Raises ShapingError (with the table) if any figure is off. Returns the rows."""
        hosts = list(hosts or self.hosts)
        for h in hosts:
            if not self.qdisc_ok(h):
                raise ShapingError(f"{h.ns}: tbf qdisc missing or wrong rate")
        if len(hosts) < 2:
            raise ShapingError("shaping check needs at least 2 hosts")
        rows = []
        n = len(hosts)
        pairs = [(hosts[i], hosts[(i + 1) % n]) for i in range(n)] if n > 2 else [(hosts[0], hosts[1]), (hosts[1], hosts[0])]
        got = self._stream(pairs, dur, warm)
        covered = set()
        for (s, d), g in zip(pairs, got):
            exp = min(s.rate, d.rate) * PAYLOAD_EFF
            rows.append((f"{s.ns}->{d.ns}", exp, g))
            if s.rate <= d.rate:
                covered.add(("out", s.ns))
            if d.rate <= s.rate:
                covered.add(("in", d.ns))
        for h in hosts:
            others = sorted((o for o in hosts if o is not h), key=lambda o: -o.rate)
            for direction in ("in", "out"):
                if (direction, h.ns) in covered:
                    continue
                peers, tot = [], 0
                for o in others:
                    if tot >= h.rate * 1.25:
                        break
                    peers.append(o)
                    tot += o.rate
                if tot < h.rate:
                    log(f"note: {h.ns} {direction}: other hosts together are slower than its link; "
                        f"checked at {fmt_rate(tot)}")
                prs = [(o, h) for o in peers] if direction == "in" else [(h, o) for o in peers]
                g = sum(self._stream(prs, dur, warm))
                exp = min(h.rate, tot) * PAYLOAD_EFF
                rows.append((f"{h.ns} {direction} ({len(peers)} peers)", exp, g))
        bad = [r for r in rows if not (lo <= r[2] / r[1] <= hi)]
        table = "\n".join(f"  {name:<28} expect {e / 1e6:8.1f} Mbit/s  got {g / 1e6:8.1f}  ({g / e:5.1%})"
                          for name, e, g in rows)
        out = [{"link": n_, "expect_bps": e, "got_bps": g} for n_, e, g in rows]
        if bad:
            err = ShapingError("link shaping check off:\n" + table)
            err.rows = out
            raise err
        log("link shaping check passed (goodput vs rate x %.3f payload efficiency):\n%s" % (PAYLOAD_EFF, table))
        return out


def umount(path):
    if not is_mounted(path):
        return
    r = sh(["fusermount3", "-u", path], check=False)
    for _ in range(100):
        if not is_mounted(path):
            return
        time.sleep(0.05)
    sh(["fusermount3", "-uz", path], check=False)
    if r.returncode != 0 and is_mounted(path):
        sh(["umount", "-l", path], check=False)


def abort_stuck_fuse(conns):
    """Abort those of our FUSE connections that outlived their unmount with requests still
    waiting (daemon gone): otherwise the superblock teardown hangs and with it every sync and
    drop_caches on the machine. Uses fusectl (mounted for the moment if it is not)."""
    if not conns:
        return
    base = "/sys/fs/fuse/connections"
    mounted_here = False
    if not os.listdir(base):
        if sh(["mount", "-t", "fusectl", "fusectl", base], check=False).returncode != 0:
            return
        mounted_here = True
    try:
        time.sleep(0.5)
        live = set()
        with open("/proc/self/mountinfo") as f:
            for line in f:
                maj, mnr = line.split()[2].split(":")
                live.add((int(maj) << 20) | int(mnr))
        for c in conns:
            d = os.path.join(base, str(c))
            if c in live or not os.path.isdir(d):
                continue  # still mounted somewhere visible (not ours any more) or gone: leave it
            try:
                if int(open(os.path.join(d, "waiting")).read()) > 0:
                    with open(os.path.join(d, "abort"), "w") as f:
                        f.write("1")
            except OSError:
                pass
    finally:
        if mounted_here:
            sh(["umount", base], check=False)


def cleanup_leftovers(prefix=PREFIX, workdir=None):
    """Remove everything this harness may have left behind with this prefix: mounts under
    /var/tmp/PREFIXcluster-*, processes inside PREFIX* namespaces, the namespaces, veths, bridge."""
    marks = [f"/var/tmp/{prefix}cluster-", f"/var/tmp/{prefix}"]
    if workdir:
        marks.append(os.path.realpath(workdir) + "/")
    with open("/proc/self/mountinfo") as f:
        mps = [line.split()[4] for line in f]
    for mp in reversed(mps):
        if any(mp.startswith(m) for m in marks):
            umount(mp)
    r = sh(["ip", "netns", "list"], check=False)
    nss = [line.split()[0] for line in r.stdout.splitlines() if line.split() and line.split()[0].startswith(prefix)]
    for ns in nss:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = sh(["ip", "netns", "pids", ns], check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), sig)
                except (ProcessLookupError, ValueError):
                    pass
            for _ in range(60):
                if not sh(["ip", "netns", "pids", ns], check=False).stdout.split():
                    break
                time.sleep(0.05)
        sh(["ip", "netns", "del", ns], check=False)
    r = sh(["ip", "-o", "link", "show"], check=False)
    for line in r.stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(prefix):
            sh(["ip", "link", "del", name], check=False)
